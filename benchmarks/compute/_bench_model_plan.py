"""What bench_model.py measures, shared by its sides and its report: the prompt lengths, the batches, the prompts.

Token ids are drawn inside the real Qwen3 tokenizer's vocabulary, seeded, so both sides see the same prompts.
"""

from __future__ import annotations

PREFILL_LENGTHS = (128, 512)  # prompt tokens of the prefill runs
BATCHES = (4, 8, 16)  # concurrent sequences of the batched decode runs
SHORT_PROMPT = 8  # tokens before a decode measurement
PAIRS = 4  # alternated bare-forward and engine runs per batch size, for engine / bare


def prompt(length: int, seed: int) -> list[int]:
    """Token ids inside the real Qwen3 tokenizer's vocabulary (the engine detokenizes them)."""
    import numpy as np

    return np.random.default_rng(seed).integers(1000, 150000, size=length).tolist()


def median(values: list[float]) -> float:
    """The median: a step rate that a burst of load from other processes does not drag down."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2]
