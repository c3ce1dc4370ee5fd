"""The integer products (activations quantized to int8 per block) on every GGUF fixture, against the exact ones.

Each fixture's decode steps, teacher-forced along transformers' greedy tokens, in both modes: the logits'
largest difference relative to the row's largest logit, and how often the integer step's top token is the
exact one's. The integer arithmetic is the same on every CPU (each kernel equals the portable reference bit
for bit), so these figures are the board's too. Measured (benchmarks/RESULTS.md, "Integer products'
fidelity"): relative
differences at most 4-7% a step on the dense fixtures, 2-3% in the median step, the top token the same in 30-32
of 32 steps (the fixtures are tiny random models whose logits lie close together; every quantized tensor,
Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K, takes the integer products). On the MoE fixture one step
in 32 differs by 57%: the rounded activations route a token to another expert there (its Q4_K tensor alone
moves no step by more than 3%).
"""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import pytest

from kestrel_trio import _kernels, load_model
from kestrel_trio._kernels import cpu
from kestrel_trio._kernels.x86 import integer as x86_integer

pytestmark = pytest.mark.skipif(not _kernels.ready(), reason=_kernels.unavailable_reason())

GGUF_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gguf"
NAMES = sorted(p.name for p in GGUF_FIXTURES.iterdir() if (p / "golden.npz").exists())


def decode_logits(name: str, mode: str) -> tuple[np.ndarray, dict[str, str]]:
    """[steps, vocab] logits of each decode step along the golden greedy tokens, and the kernels that took them."""
    golden = np.load(GGUF_FIXTURES / name / "golden.npz")
    prompt, answer = golden["prompt_ids"].tolist(), golden["greedy_ids"].tolist()
    model = load_model(GGUF_FIXTURES / name / f"{name}.gguf", products=mode)
    cache = model.new_cache()
    rows = [model.step(cache, prompt, all_logits=True)[-1:]]
    rows += [model.step(cache, [token], all_logits=True) for token in answer[:-1]]
    return np.concatenate(rows), model.kernel_report()["products"]  # [len(answer), vocab]


@pytest.mark.parametrize("name", NAMES)
def test_integer_decode_steps_stay_within_a_few_percent_of_the_exact_logits(name):
    exact, exact_kernels = decode_logits(name, "exact")
    integer, integer_kernels = decode_logits(name, "integer")
    for form in set(exact_kernels) & {"Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q6_K"}:
        assert exact_kernels[form] == "portable" and integer_kernels[form] in ("sdot", "neon", "vnni", "avx2", "int8")
        if platform.machine() == "x86_64" and cpu.this_cpu().has("avx2") and form in x86_integer.FORMS:
            assert integer_kernels[form] in ("vnni", "avx2")  # x86-64's own kernels, not the reference
    relative = np.abs(integer - exact).max(axis=1) / np.abs(exact).max(axis=1)  # [steps]
    assert relative.min() > 0  # the integer products ran
    assert np.median(relative) <= 0.03
    # every step of a dense model; an MoE's step may route to another expert (one of 32 here)
    assert np.sort(relative)[-2 if "moe" in name else -1] <= 0.08
    assert (integer.argmax(axis=1) == exact.argmax(axis=1)).sum() >= 29

