"""Time to first token with and without a prefix-cache hit, through the engine.

Usage:
    python benchmarks/features/bench_prefix.py [--model DIR] [--system-tokens 1000] [--rounds 3]

The model defaults to the random checkpoint with Qwen3-0.6B's exact shapes that
benchmarks/weights/bench_load.py builds (bf16 storage, with the real Qwen3 tokenizer
copied beside it): run that first. Each round sends a chat prompt made of a
~``--system-tokens``-token system message and a short question to an engine
whose prefix cache is empty (cold), then the same system message with another
question (a hit: the system part is restored, only the rest is computed). Time
to first token is measured from submission to the first delta. Target: the hit
is >= 10x faster than cold. The first tokens of the hit run are also compared
with the same prompt on an engine without the cache (they must be equal).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from pathlib import Path

import trio

from kestrel_trio import EngineLimits, GenerationRequest, SamplingParams, load_model, run_engine

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules
from _bench_common import blas_description  # noqa: E402

DEFAULT_MODEL = Path.home() / ".cache" / "kestrel-trio-bench" / "qwen3-0.6b-shapes-bf16"
_FILLER = ("The kestrel hovers over the meadow, reading the wind, and every field note it makes is kept in "
           "order so that later questions about the season can be answered from these notes alone. ")


def system_prompt(model, tokens: int) -> str:
    text = ""
    while len(model.encode(text)) < tokens:
        text += _FILLER
    return text


def chat_request(model, system: str, question: str, max_tokens: int) -> GenerationRequest:
    text = model.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": question}],
                                     enable_thinking=False)
    return GenerationRequest(tuple(model.encode(text)),
                             SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))


async def first_tokens(engine, request: GenerationRequest) -> tuple[float, list[int], int]:
    """Seconds to the first delta, the token ids, and the prompt tokens restored from the cache."""
    started = time.perf_counter()
    ttft = None
    tokens: list[int] = []
    cached = 0
    async with engine.open_generation(request) as deltas:
        async for delta in deltas:
            ttft = ttft if ttft is not None else time.perf_counter() - started
            tokens.append(delta.token_id)
            cached = delta.cached_tokens
    return ttft, tokens, cached


async def one_round(model, system: str, index: int, max_tokens: int) -> dict:
    cold_request = chat_request(model, system, f"Question {index}: what did the kestrel see first?", max_tokens)
    hit_request = chat_request(model, system, f"Question {index}: and what did it see last?", max_tokens)
    async with trio.open_nursery() as nursery:
        engine = await nursery.start(functools.partial(run_engine, model, limits=EngineLimits()))
        cold, _, cold_cached = await first_tokens(engine, cold_request)
        hit, hit_tokens, hit_cached = await first_tokens(engine, hit_request)
        nursery.cancel_scope.cancel()
    async with trio.open_nursery() as nursery:
        plain = await nursery.start(functools.partial(run_engine, model, limits=EngineLimits(prefix_cache_bytes=0)))
        _, plain_tokens, _ = await first_tokens(plain, hit_request)
        nursery.cancel_scope.cancel()
    return {"prompt": len(hit_request.prompt_ids), "cold": cold, "hit": hit, "cold_cached": cold_cached,
            "hit_cached": hit_cached, "same_tokens": hit_tokens == plain_tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--system-tokens", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=4)
    args = parser.parse_args()
    if not (args.model / "tokenizer.json").exists():
        raise SystemExit(f"{args.model} has no tokenizer.json: run benchmarks/weights/bench_load.py first, "
                         "or pass --model")
    print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    model = load_model(args.model)
    print(f"model: {args.model.name}, weights {model.weights_mode}; BLAS: {blas_description()} "
          "(the machine's OPENBLAS_* settings kept)")
    system = system_prompt(model, args.system_tokens)
    rows = [trio.run(one_round, model, system, i, args.max_tokens) for i in range(args.rounds)]
    for row in rows:
        print(f"  prompt {row['prompt']} tokens: cold TTFT {row['cold'] * 1000:8.1f} ms, hit TTFT "
              f"{row['hit'] * 1000:7.1f} ms ({row['hit_cached']} tokens restored), ratio {row['cold'] / row['hit']:5.1f}x, "
              f"output equal to an uncached run: {row['same_tokens']}")
    ratio = statistics.median(r["cold"] / r["hit"] for r in rows)
    ok = ratio >= 10 and all(r["same_tokens"] for r in rows)
    print(f"median ratio cold / hit: {ratio:.1f}x (target >= 10x) {'PASS' if ok else 'FAIL'}")
    print("load average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
