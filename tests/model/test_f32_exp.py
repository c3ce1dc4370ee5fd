"""Attention's softmax numerators in AVX-512 assembly (kestrel_trio._kernels.x86.float32.exp) against exp.py's loops and
float64: equal numerators, the causal count of each row, zeros past it, special values. Wherever the CPU executes
it (the plan's runnable softmax variants: an x86-64 CPU with AVX-512, chosen or not); elsewhere the tests skip with
the reason."""

from __future__ import annotations

import numpy as np
import pytest

from kestrel_trio._kernels import loaded

from kernel_plan_kit import runnable

_RUNNABLE = runnable("softmax")
pytestmark = [pytest.mark.host_cpu, pytest.mark.skipif(
    "avx512" not in _RUNNABLE, reason=f"this host does not execute the AVX-512 softmax (runnable: {_RUNNABLE})")]


@pytest.fixture(autouse=True)
def _assembler():
    loaded.dispatch().f32_assembly()  # readies LLVM's assembly parser: the kernel is assembly


def _assembly(scores: np.ndarray, counts: list[int], width: int) -> tuple[np.ndarray, np.ndarray]:
    from kestrel_trio._kernels.x86.float32 import exp as f32_exp

    got, sums = scores.copy(), np.empty(scores.shape[0], np.float32)  # [R, W], [R]
    f32_exp.softmax_rows(got, np.array(counts, np.int64), width, sums, np.zeros(f32_exp.OPERANDS, np.int64))
    return got, sums


def _loops(scores: np.ndarray, counts: list[int], width: int) -> tuple[np.ndarray, np.ndarray]:
    from kestrel_trio._kernels.x86.float32 import attention as f32_attention

    got, sums, maxima = scores.copy(), np.empty(scores.shape[0], np.float32), np.empty(16, np.float32)
    for r, count in enumerate(counts):
        sums[r] = f32_attention._softmax_numerators(got, r, count, width, maxima)
    return got, sums


@pytest.mark.parametrize("width", [32, 64, 512])
def test_the_numerators_equal_the_loops_and_float64_for_every_count(width):
    rng = np.random.default_rng(width)
    counts = sorted({1, 2, 15, 16, 17, 31, width // 2 + 3, width - 1, width} & set(range(1, width + 1)))
    scores = (rng.standard_normal((len(counts), width + 16)) * 6).astype(np.float32)  # [R, W + 16]: past the width
    got, sums = _assembly(scores, counts, width)
    want, want_sums = _loops(scores, counts, width)
    np.testing.assert_array_equal(got[:, :width], want[:, :width])  # the same exponential, lane by lane
    np.testing.assert_allclose(sums, want_sums, rtol=2e-6)  # the same sum in another order
    np.testing.assert_array_equal(got[:, width:], scores[:, width:])  # nothing past the width written
    for r, count in enumerate(counts):
        row = scores[r, :count]
        exact = np.exp((row - row.max()).astype(np.float64))  # [count]: of the float32 differences, as computed
        np.testing.assert_allclose(got[r, :count], exact, rtol=2e-7, atol=1e-30)  # 1.7 ulp
        assert sums[r] == pytest.approx(exact.sum(), rel=1e-6)
        assert not got[r, count:width].any()  # the causal mask: keys after the query's weigh nothing


def test_scores_far_below_the_maximum_weigh_zero_and_a_nan_score_makes_its_row_nan():
    scores = np.zeros((3, 32), np.float32)
    scores[0, :5] = [0.0, -87.33, -87.34, -1000.0, -np.inf]
    scores[1, :3] = [1e30, 0.0, -1e30]
    scores[2, :3] = [1.0, np.nan, 2.0]
    got, sums = _assembly(scores, [5, 3, 3], 32)
    assert got[0, 0] == 1.0 and 1.17e-38 < got[0, 1] < 1.2e-38 and not got[0, 2:].any()  # as exp.py: 0 below -87.34
    assert list(got[1, :3]) == [1.0, 0.0, 0.0] and sums[1] == 1.0
    assert np.isnan(got[2, 1]) and np.isnan(sums[2])


def test_the_chunk_attention_takes_it_for_the_avx512_block_and_agrees_with_the_avx2_blocks_loops():
    from numba import types

    from kestrel_trio._kernels.x86.float32 import attention as f32_attention

    wide = f32_attention._softmax_block_for(*[None] * 6, types.IntegerLiteral(f32_attention.LANES[0]))
    narrow = f32_attention._softmax_block_for(*[None] * 6, types.IntegerLiteral(f32_attention.LANES[1]))
    assert "softmax_rows" in wide.__code__.co_names and "softmax_rows" not in narrow.__code__.co_names
    rng = np.random.default_rng(1)
    q = rng.standard_normal((40, 4, 32)).astype(np.float32)  # [T, n_heads, head_dim]
    keys, values = rng.standard_normal((2, 2, 47, 32)).astype(np.float32)  # [n_kv, past + T, head_dim] each
    out, loops = np.empty((2, 40, 128), np.float32)  # [T, n_heads*head_dim] each
    f32_attention.attend_heads_avx512(q, keys, values, 7, np.float32(0.2), out, 0, 2)
    f32_attention.attend_heads_avx2(q, keys, values, 7, np.float32(0.2), loops, 0, 2)  # exp.py's loops
    np.testing.assert_allclose(out, loops, rtol=0, atol=2e-6)
