"""Use the engine directly from trio, with no HTTP: several generations at once.

Run: python examples/engine_without_http.py [MODEL]

MODEL is what ``kestrel-trio --model`` takes: a checkpoint folder, a .gguf file, a hub repo id, or a named
model such as smollm2-135m (downloaded once); without it, the built-in demo model (random weights).
"""

import argparse

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


def load(name: str | None) -> kestrel_trio.Model:
    if name is None:
        return kestrel_trio.load_demo_model()
    return kestrel_trio.load_model(kestrel_trio.resolve_model(name).path)  # a name or repo id: its local file


async def main(model: kestrel_trio.Model) -> None:
    async with trio.open_nursery() as nursery:
        engine = await nursery.start(kestrel_trio.run_engine, model)
        async with trio.open_nursery() as questions:
            for question in ("What is 2+2?", "Name a bird.", "你好"):
                questions.start_soon(ask, engine, model, question)
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", metavar="MODEL",
                        help="a checkpoint folder, .gguf file, hub repo id or named model (default: the demo model)")
    try:
        loaded = load(parser.parse_args().model)
    except kestrel_trio.KestrelError as exc:  # a wrong name or folder: one line, not a traceback
        parser.exit(2, f"{parser.prog}: error: {exc.message}\n")
    trio.run(main, loaded)
