"""Structured outputs: what the grammar's token masks add to a decode step, on Qwen3-0.6B shapes.

Usage:
    python benchmarks/features/bench_grammar.py [--steps N] [--rounds N] [--keep-openblas-env]

Builds once (in ~/.cache/kestrel-trio-bench/, shared with bench_load.py) a
checkpoint with Qwen3-0.6B's exact shapes and random weights (bf16 storage,
loaded as fp32 weights like `serve` does when they fit), with the real Qwen3
tokenizer of the demo model. Then, at batch 1 and batch 8, it times the same
batched decode step (``step_generations``, the engine's step) side by side:

* free: no constraint;
* beside: every sequence under a grammar, its masks computed in the helper
  thread while the forward pass runs (what the server does);
* inline: the batch's masks in one llguidance call in the step's thread, before the forward;
* one-by-one: each sequence computes its own mask when it samples.

Two grammars: ``json_object`` (any object: random weights write its strings
forever, where a mask allows most of the vocabulary, the costliest case) and
a schema of bounded fields (restarted when a sequence completes it). Only
steps in which every sequence decodes count (no prefill); the figure is the
median step time, the best over ``--rounds`` alternated rounds (so a burst of
load from other processes does not decide it). The mask share is the masks'
time on the step's path (the wait for the helper thread, or the computation
one by one, then turning the bits into a row with the EOS ids; measured
inside the step) over the fastest free step; target <= 10%. Also printed:
the median step against the free one, llguidance's own compute time per
step, and how long the step waited for it. On a machine shared with other
work the step times swing; the path time is measured in the same step.

This machine may set OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (for old OpenBLAS
builds); the benchmark re-executes itself without them unless
--keep-openblas-env, and prints the kernel OpenBLAS actually ran.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules
from _bench_common import (  # noqa: E402
    blas_description, cpu_vector_flags, openblas_overrides_note, run_without_openblas_overrides,
)
from _checkpoints import build  # noqa: E402

CACHE = Path.home() / ".cache" / "kestrel-trio-bench"
BATCHES = (1, 8)
MODES = ("free", "beside", "inline", "one-by-one")
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 4},
    "size": {"enum": ["S", "M", "L"]}, "count": {"type": "integer", "minimum": 0, "maximum": 999},
    "ratio": {"type": "number", "minimum": 0, "maximum": 1}}, "required": ["name", "tags", "size", "count"]}


def constraints(model):
    from kestrel_trio.text.constraints import grammar as g
    from kestrel_trio.text.constraints.constraint import compile_constraint, grammar_vocab

    vocab = grammar_vocab(model.tokenizer, model.config.vocab_size)
    return {"json_object": compile_constraint(vocab, g.json_object_grammar(), kind="json_object", param="-"),
            "schema": compile_constraint(vocab, g.json_schema_grammar(SCHEMA), kind="json_schema", param="-")}


def new_generation(model, constraint, index: int):
    from kestrel_trio.text import SamplingParams
    from kestrel_trio.text.generation import Generation

    tokenizer = model.tokenizer
    prompt = tokenizer.encode(f"Reply in JSON, please ({index}).")
    params = SamplingParams(temperature=1.0, seed=index, max_tokens=100_000, ignore_eos=constraint is None)
    return Generation(prompt, params, tokenizer=tokenizer, eos_token_ids=tokenizer.eos_token_ids,
                      cache=model.new_cache(), vocab_size=model.config.vocab_size, constraint=constraint)


def time_steps(model, batch: int, constraint, mode: str, steps: int) -> dict:
    """Median step time (s) over ``steps`` all-decode steps; per step: llguidance's compute, the wait for it,
    and the mask's whole time on the step's path (``token_mask``: the wait or the computation, then the
    bits made a boolean row with the EOS ids), summed over the batch."""
    import kestrel_trio.engine.step.batch as batch_module
    from kestrel_trio.text.constraints.constraint import ConstraintState, start_masks

    on_path = [0.0]
    real_token_mask = ConstraintState.token_mask

    def timed_token_mask(state):
        started = time.perf_counter()
        try:
            return real_token_mask(state)
        finally:
            on_path[0] += time.perf_counter() - started

    ConstraintState.token_mask = timed_token_mask

    if mode == "inline":
        batch_module.start_masks = lambda states: start_masks(states, beside=False)
    elif mode == "one-by-one":
        batch_module.start_masks = lambda states: None
    else:
        batch_module.start_masks = start_masks
    made = [0]

    def fresh():
        made[0] += 1
        return new_generation(model, constraint, made[0])

    generations = [fresh() for _ in range(batch)]
    times, computed, waited, path = [], [], [], []
    while len(times) < steps:
        all_decoding = all(g.phase.value == "decode" for g in generations)
        on_path[0] = 0.0
        started = time.perf_counter()
        batch_module.step_generations(model, generations)
        elapsed = time.perf_counter() - started
        timings = [t for g in generations if g.constraint is not None and (t := g.constraint.take_timing())]
        if all_decoding:
            times.append(elapsed)
            path.append(on_path[0])
            if timings:
                computed.append(max(seconds for seconds, _ in timings))
                waited.append(sum(wait for _, wait in timings))
        generations = [g if g.finish_reason is None else fresh() for g in generations]
    batch_module.start_masks = start_masks
    ConstraintState.token_mask = real_token_mask
    return {"step": statistics.median(times), "fastest": min(times), "path": statistics.median(path),
            "compute": statistics.median(computed) if computed else 0.0,
            "wait": statistics.median(waited) if waited else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24, help="all-decode steps timed per mode and round")
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds; each figure keeps its best")
    parser.add_argument("--keep-openblas-env", action="store_true", help="keep OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE")
    parser.add_argument("--cache", type=Path, default=CACHE)
    args = parser.parse_args()
    run_without_openblas_overrides(args.keep_openblas_env)

    from kestrel_trio import load_model
    from kestrel_trio.text import Tokenizer

    print(f"machine: {os.cpu_count()} cpus, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"CPU vector flags: {cpu_vector_flags()}")
    print(f"OpenBLAS overrides: {openblas_overrides_note()}")
    folder = args.cache / "qwen3-0.6b-shapes-bf16"
    build(folder, "BF16")
    model = load_model(folder, weights="fp32")
    model.tokenizer = Tokenizer.from_demo()  # the real Qwen3 vocabulary (151,669 of the 151,936 rows)
    print(f"numpy BLAS: {blas_description()}")
    started = time.perf_counter()
    grammars = constraints(model)
    print(f"grammar vocabulary + 2 grammars compiled in {time.perf_counter() - started:.2f} s", flush=True)

    best: dict = {}
    for _ in range(args.rounds):
        for batch in BATCHES:
            for name, constraint in grammars.items():
                for mode in MODES:
                    figures = time_steps(model, batch, None if mode == "free" else constraint, mode, args.steps)
                    key = (batch, name, mode)
                    if key not in best or figures["step"] < best[key]["step"]:
                        best[key] = figures
    print(f"\ndecode step, best of {args.rounds} rounds ({args.steps} all-decode steps each). step: median and "
          "fastest step; diff: median step against free's; llg: llguidance computing the step's masks; wait: "
          "the step waiting for them; path: the masks' whole time on the step's path (wait, or computing one by "
          "one, then the bits to a row); share = path / free's fastest step, target <= 10%")
    print(f"{'batch':>5} {'grammar':>12} {'mode':>11} {'median ms':>10} {'fastest':>8} {'diff':>7} "
          f"{'llg ms':>8} {'wait ms':>8} {'path ms':>8} {'share':>7}")
    for batch in BATCHES:
        for name in grammars:
            free = best[(batch, name, "free")]
            for mode in MODES:
                f = best[(batch, name, mode)]
                diff = "" if mode == "free" else f"{(f['step'] - free['step']) / free['step']:+7.1%}"
                share = "" if mode == "free" else f"{f['path'] / free['fastest']:7.2%}"
                print(f"{batch:5d} {name:>12} {mode:>11} {f['step'] * 1e3:10.2f} {f['fastest'] * 1e3:8.2f} {diff:>7} "
                      f"{f['compute'] * 1e3:8.3f} {f['wait'] * 1e3:8.3f} {f['path'] * 1e3:8.3f} {share:>7}")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
