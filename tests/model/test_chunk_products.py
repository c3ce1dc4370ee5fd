"""Float32 products of prefill chunks in kestrel's own AVX-512 kernel (_kernels.x86.float32.chunks): float32's
accuracy at every shape, the rows and columns past whole blocks included, and taken by linear() for prefill rows
only. Wherever the CPU executes them (the plan's runnable variants: x86-64 with AVX-512, chosen on Intel's, played as
chosen on others); elsewhere the tests skip with the reason."""

from __future__ import annotations

import numpy as np
import pytest

from kestrel_trio import _kernels
from kestrel_trio._kernels import loaded
from kestrel_trio._kernels.wrappers import prefill
from kestrel_trio._model.products import matmul

from kernel_plan_kit import enable_chunk_kernel, runnable

_RUNNABLE = runnable("chunk_products")
pytestmark = [pytest.mark.host_cpu, pytest.mark.skipif(
    "avx512" not in _RUNNABLE, reason=f"this host does not execute the AVX-512 chunk kernel "
                                      f"({_kernels.unavailable_reason() or prefill._chunks_unusable()})")]


@pytest.fixture(autouse=True)
def _enabled(monkeypatch):
    enable_chunk_kernel(monkeypatch)


def _serially(tasks):
    for task in tasks:
        task()


def _split(parts: int):
    return lambda items: [(items * p // parts, items * (p + 1) // parts) for p in range(parts)]


def _relative_error(got: np.ndarray, x: np.ndarray, w: np.ndarray) -> float:
    exact = x.astype(np.float64) @ w.T.astype(np.float64)  # [m, n]
    return float(np.abs(got - exact).max() / np.abs(exact).max())


@pytest.mark.parametrize("m, n, k", [(33, 20, 64), (64, 28, 1028), (100, 47, 96), (130, 70, 3072), (256, 30, 2052),
                                     (40, 13, 64), (31, 30, 64), (96, 14, 4), (129, 30, 64), (192, 45, 1028)])
@pytest.mark.parametrize("shares", [1, 2, 3])
def test_the_product_has_float32_accuracy_over_whole_blocks_and_the_rest(m, n, k, shares):
    rng = np.random.default_rng(m * n + k)
    x = rng.standard_normal((m, k), dtype=np.float32)  # [m, k]
    w = rng.standard_normal((n, k), dtype=np.float32)  # [n, k]
    got = _kernels.chunk_product(x, w, _serially, _split(shares))  # [m, n]
    assert got.shape == (m, n) and got.dtype == np.float32
    # Float32 sums over K: BLAS's own error here is up to about 7e-7 of the largest value, the kernel's 1.3e-6
    # (each output summed in order over chunks of 1024). A wrong or unwritten element is off by about 1.
    assert _relative_error(got, x, w) < 4e-6
    assert _relative_error(x @ w.T, x, w) < 4e-6


@pytest.mark.parametrize("m, shares, by_rows", [
    (64, 2, False),  # one block of 32 rows a thread: less than a GROUP
    (96, 2, False),  # three blocks: not an even split
    (128, 2, True), (129, 2, True),  # the row past whole blocks on the last share
    (192, 3, True), (256, 2, True), (256, 1, False),  # one thread: nothing to split
])
def test_the_rows_split_among_the_threads_when_they_split_evenly_a_group_each(monkeypatch, m, shares, by_rows):
    calls = []
    real = prefill._chunk_product_by_rows
    monkeypatch.setattr(prefill, "_chunk_product_by_rows", lambda *a: (calls.append(a[3]), real(*a)))
    rng = np.random.default_rng(m)
    x = rng.standard_normal((m, 1028), dtype=np.float32)  # [m, K]: two K chunks
    w = rng.standard_normal((47, 1028), dtype=np.float32)  # [47, K]: 5 weight rows past whole blocks
    got = _kernels.chunk_product(x, w, _serially, _split(shares))  # [m, 47]
    assert bool(calls) == by_rows
    if by_rows:
        assert calls == [[(m // 32 * 32 * p // shares, m // 32 * 32 * (p + 1) // shares) for p in range(shares)]]
    assert _relative_error(got, x, w) < 4e-6


def test_weights_with_a_row_stride_of_their_own_and_strided_activations():
    rng = np.random.default_rng(3)
    wide = rng.standard_normal((60, 200), dtype=np.float32)  # [60, 200]
    w = wide[:, 8:136]  # [60, 128]: rows 800 bytes apart, columns contiguous
    x = rng.standard_normal((70, 256), dtype=np.float32)[:, ::2]  # [70, 128], not contiguous
    got = _kernels.chunk_product(x, w, _serially, _split(2))  # [70, 60]
    assert _relative_error(got, x, w) < 4e-6


@pytest.mark.parametrize("rows, taken", [(32, False), (33, True), (128, True), (256, True), (257, False)])
def test_linear_takes_the_kernel_for_prefill_rows_only(monkeypatch, rows, taken):
    calls = []
    product = _kernels.chunk_product
    monkeypatch.setattr(_kernels, "chunk_product", lambda *args: calls.append(args[0].shape) or product(*args))
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 64), dtype=np.float32)  # [rows, 64]
    w = rng.standard_normal((48, 64), dtype=np.float32)  # [48, 64]
    got = matmul.linear(x, w)  # [rows, 48]
    assert calls == ([(rows, 64)] if taken else [])
    assert _relative_error(got, x, w) < 4e-6


def test_weights_it_cannot_take_go_to_blas(monkeypatch):
    calls = []
    monkeypatch.setattr(_kernels, "chunk_product", lambda *args: calls.append(args[0].shape))
    rng = np.random.default_rng(5)
    x = rng.standard_normal((64, 66), dtype=np.float32)  # [64, 66]: K not a multiple of 4
    w = rng.standard_normal((48, 66), dtype=np.float32)
    assert _relative_error(matmul.linear(x, w), x, w) < 4e-6
    x = rng.standard_normal((64, 64), dtype=np.float32)
    w = rng.standard_normal((13, 64), dtype=np.float32)  # fewer rows than a block
    assert _relative_error(matmul.linear(x, w), x, w) < 4e-6
    assert calls == []


def test_a_failed_self_test_keeps_the_kernel_off_on_every_later_call(monkeypatch):
    for key in ("chunks", "chunks_error"):  # each restored (or removed again) when the test ends
        monkeypatch.setitem(loaded._state, key, None)
        monkeypatch.delitem(loaded._state, key)
    monkeypatch.setattr(prefill, "_chunks_self_test", lambda chunks: "disagrees with numpy (a stand-in)")
    assert _kernels.enable_chunk_products() == "disagrees with numpy (a stand-in)"
    assert _kernels.enable_chunk_products() == "disagrees with numpy (a stand-in)"
    assert "chunks" not in loaded._state
    x = np.ones((64, 64), dtype=np.float32)
    assert np.array_equal(matmul.linear(x, np.ones((48, 64), dtype=np.float32)), np.full((64, 48), 64.0))


@pytest.mark.parametrize("broken, named", [("product", "chunk"), ("packed_product", "packed")])
def test_the_self_test_finds_either_kernel_wrong(monkeypatch, broken, named):
    from kestrel_trio._kernels.x86.float32 import chunks as f32_chunks

    real = getattr(f32_chunks, broken)

    def off_by_one(w, packed, out, *rest):  # the right sums, plus one
        real(w, packed, out, *rest)
        out += 1
    monkeypatch.setattr(f32_chunks, broken, off_by_one)
    assert f"the float32 {named} product disagrees" in prefill._chunks_self_test(f32_chunks)
    monkeypatch.setattr(f32_chunks, broken, real)
    assert prefill._chunks_self_test(f32_chunks) is None
