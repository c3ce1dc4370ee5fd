"""Use the engine directly from trio, with no HTTP: several generations at once.

Run: python examples/engine_without_http.py [CHECKPOINT_DIR]
"""

import sys

import trio

import kestrel_trio


async def ask(engine: kestrel_trio.Engine, model: kestrel_trio.Model, question: str) -> None:
    prompt = model.apply_chat_template([{"role": "user", "content": question}], enable_thinking=False)
    request = kestrel_trio.GenerationRequest(
        prompt_ids=tuple(model.encode(prompt)),
        params=kestrel_trio.SamplingParams(temperature=0.0, max_tokens=24),
    )
    pieces = []
    async with engine.open_generation(request) as deltas:
        async for delta in deltas:
            pieces.append(delta.text)
    print(f"{question!r} -> {''.join(pieces)!r} ({delta.finish_reason}, {delta.completion_tokens} tokens)")


async def main() -> None:
    model = kestrel_trio.load_model(sys.argv[1]) if len(sys.argv) > 1 else kestrel_trio.load_demo_model()
    async with trio.open_nursery() as nursery:
        engine = await nursery.start(kestrel_trio.run_engine, model)
        async with trio.open_nursery() as questions:
            for question in ("What is 2+2?", "Name a bird.", "你好"):
                questions.start_soon(ask, engine, model, question)
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(main)
