"""The integer products of Q8_0, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K and Q6_K weights with int8 activations
(_kernels.portable.integer, the portable reference; kestrel_trio._kernels.arm, aarch64's kernels): the reference
against numpy bit for bit, each kernel against the reference bit for bit on every CPU that runs it (extreme scales
and zero blocks too), within the activations' rounding of the exact product, compiled to ``sdot`` where the CPU has
dotprod, and taken by the products' dispatch in the integer mode."""

from __future__ import annotations

import platform

import numba
import numpy as np
import pytest

from kestrel_trio import _kernels
from kestrel_trio._model import Backend

pytestmark = pytest.mark.skipif(not _kernels.ready(), reason=_kernels.unavailable_reason())

if _kernels.ready():
    from kestrel_trio._kernels import cpu
    from kestrel_trio._kernels.portable import integer
    from kestrel_trio._kernels.arm import integer as arm
    from kestrel_trio._kernels.portable.products import f16_table

FORMS = ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q6_K"]
BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20, "Q4_K": 144, "Q5_0": 22, "Q5_1": 24, "Q5_K": 176, "Q6_K": 210}
BLOCK_COLS = {"Q8_0": 32, "Q4_0": 32, "Q4_1": 32, "Q4_K": 256, "Q5_0": 32, "Q5_1": 32, "Q5_K": 256, "Q6_K": 256}
WITH_MINIMUMS = ("Q4_1", "Q4_K", "Q5_1", "Q5_K")
# Where each form's float16 scales are (d; then m or dmin where it has minimums).
HALVES = {form: (208,) if form == "Q6_K" else (0, 2) if form in WITH_MINIMUMS else (0,) for form in FORMS}


def block_rows(form: str, rng, rows: int, cols: int) -> np.ndarray:
    """Random rows of ``form`` as a GGUF stores them: uint8 [rows, cols / block cols * block bytes], finite float16
    scales of about 1e-3 (Q4_1, Q5_1: minimums of about -8e-3; Q4_K, Q5_K: d about 1e-4, dmin about 2e-4, any
    6-bit scales; Q6_K: d about 1e-5, any int8 scales)."""
    blocks = cols // BLOCK_COLS[form]
    raw = rng.integers(0, 256, (rows, blocks, BLOCK_BYTES[form]), dtype=np.uint8)  # [rows, blocks, bytes]
    size = {"Q4_K": 1e-4, "Q5_K": 1e-4, "Q6_K": 1e-5}.get(form, 1e-3)
    at = HALVES[form][0]
    raw[:, :, at : at + 2] = (rng.uniform(0.5, 1.5, (rows, blocks, 1)) * size).astype(np.float16).view(np.uint8)
    if form in ("Q4_1", "Q5_1"):
        raw[:, :, 2:4] = (rng.uniform(-1.5, -0.5, (rows, blocks, 1)) * 8e-3).astype(np.float16).view(np.uint8)
    if form in ("Q4_K", "Q5_K"):
        raw[:, :, 2:4] = (rng.uniform(0.5, 1.5, (rows, blocks, 1)) * 2e-4).astype(np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


def extreme_rows(form: str, rng, rows: int, cols: int) -> np.ndarray:
    """As block_rows, with each float16 scale drawn from the extremes (0, the smallest subnormal, the smallest
    normal, 1, the largest finite, and their negatives) and every fourth block all zeros."""
    raw = block_rows(form, rng, rows, cols).reshape(rows, cols // BLOCK_COLS[form], -1)  # [rows, blocks, bytes]
    extremes = np.array([0.0, 6e-8, -6e-8, 6.1035e-5, 1.0, -1.0, 65504.0, -65504.0], dtype=np.float16)
    for at in HALVES[form]:
        raw[:, :, at : at + 2] = rng.choice(extremes, raw.shape[:2] + (1,)).view(np.uint8)
    raw[:, ::4] = 0
    return raw.reshape(rows, -1)


def numpy_weights(form: str, data: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per 32-weight sub-block: (int64 quants [rows, subs, 32], float32 scales [rows, subs], float32 offsets
    [rows, subs]: Q4_1's and Q5_1's m, Q4_K's and Q5_K's min * -dmin, else zeros; int64 scales [rows, subs, 2] of
    weights 0-15 and 16-31: Q6_K's int8 ones, else ones)."""
    blocks = data.reshape(data.shape[0], -1, BLOCK_BYTES[form])  # [rows, blocks, bytes]
    if form in ("Q4_K", "Q5_K"):
        quants, scale_w, offset_w = k_weights(blocks)
        return quants, scale_w, offset_w, np.ones(quants.shape[:2] + (2,), dtype=np.int64)
    if form == "Q6_K":
        return q6_k_weights(blocks)
    d = blocks[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # [rows, blocks]
    m = np.zeros_like(d)
    ones = np.ones(d.shape + (2,), dtype=np.int64)  # [rows, blocks, 2]
    if form == "Q8_0":
        return blocks[:, :, 2:].view(np.int8).astype(np.int64), d, m, ones
    quant_at = {"Q4_0": 2, "Q4_1": 4, "Q5_0": 6, "Q5_1": 8}[form]
    nibbles = blocks[:, :, quant_at:].astype(np.int64)  # [rows, blocks, 16]
    quants = np.concatenate([nibbles & 15, nibbles >> 4], axis=-1)  # [rows, blocks, 32]: low ones, then high
    if form in ("Q5_0", "Q5_1"):  # bit i of the little-endian uint32 before the nibbles: weight i's fifth bit
        fifth = blocks[:, :, quant_at - 4 : quant_at].copy().view("<u4").astype(np.int64)  # [rows, blocks, 1]
        quants |= ((fifth >> np.arange(32)) & 1) << 4
    if form in ("Q4_1", "Q5_1"):
        return quants, d, blocks[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float32), ones
    return quants - (16 if form == "Q5_0" else 8), d, m, ones


def q6_k_weights(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Q6_K's blocks [rows, blocks, 210] as numpy_weights gives them: in each half of 128 weights, quarter q
    (weights 32q..32q+31) the low (q < 2) or high nibbles of the half's first (q even) or second 32 bytes of
    nibbles, bits 2q, 2q+1 of its 32 high-bit bytes; less 32; an int8 scale a 16 weights; d at byte 208."""
    rows = blocks.shape[0]
    low = blocks[:, :, 0:128].astype(np.int64).reshape(rows, -1, 2, 2, 32)  # [rows, blocks, half, which, 32]
    high = blocks[:, :, 128:192].astype(np.int64).reshape(rows, -1, 2, 32)  # [rows, blocks, half, 32]
    quarters = [((low[:, :, :, q % 2] >> (4 * (q // 2))) & 15) | (((high >> (2 * q)) & 3) << 4) for q in range(4)]
    quants = np.stack(quarters, axis=3).reshape(rows, -1, 32) - 32  # [rows, blocks * 8, 32]
    d = blocks[:, :, 208:210].copy().view(np.float16)[..., 0].astype(np.float32)  # [rows, blocks]
    scale_w = np.repeat(d, 8, axis=1)  # [rows, blocks * 8]
    scales = blocks[:, :, 192:208].view(np.int8).astype(np.int64).reshape(rows, -1, 2)  # [rows, blocks * 8, 2]
    return quants, scale_w, np.zeros_like(scale_w), scales


def k_weights(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K's blocks [rows, blocks, 144] or Q5_K's [rows, blocks, 176] as numpy_weights gives them, ggml's 6-bit
    packing of scales and mins (Q5_K: bit j of its 32 bytes at 16 is weight i's fifth bit in sub-block j)."""
    rows = blocks.shape[0]
    d = blocks[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # [rows, blocks]
    dmin = blocks[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float32)  # [rows, blocks]
    q = blocks[:, :, 4:16].astype(np.int64)  # [rows, blocks, 12]
    scales = np.concatenate([q[..., 0:4] & 63, (q[..., 8:12] & 15) | ((q[..., 0:4] >> 6) << 4)], axis=-1)
    mins = np.concatenate([q[..., 4:8] & 63, (q[..., 8:12] >> 4) | ((q[..., 4:8] >> 6) << 4)], axis=-1)
    five = blocks.shape[2] == 176
    pairs = blocks[:, :, 48 if five else 16:].astype(np.int64).reshape(rows, -1, 4, 32)  # [rows, blocks, pair, 32]
    quants = np.stack([pairs & 15, pairs >> 4], axis=3).reshape(rows, -1, 32)  # [rows, blocks * 8, 32]
    if five:
        fifth = blocks[:, :, None, 16:48].astype(np.int64) >> np.arange(8)[:, None]  # [rows, blocks, 8, 32]
        quants |= ((fifth & 1) << 4).reshape(rows, -1, 32)
    scale_w = (d[..., None] * scales.astype(np.float32)).reshape(rows, -1)  # [rows, blocks * 8]
    offset_w = (mins.astype(np.float32) * -dmin[..., None]).reshape(rows, -1)  # [rows, blocks * 8]
    return quants, scale_w, offset_w


def numpy_quantized(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's Q8_0 activation quantization in numpy: int8 [N, cols], float32 scales [N, cols / 32]."""
    blocks = x.reshape(x.shape[0], -1, 32)  # [N, blocks, 32]
    d = np.abs(blocks).max(axis=-1) / np.float32(127)  # [N, blocks]
    inverse = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d > 0)
    return np.rint(blocks * inverse[..., None]).astype(np.int8).reshape(x.shape), d


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 ``a * b + c`` rounded once, in numpy: the product is exact in float64 and the sum rounded to odd
    there (TwoSum's error nudges an inexact even result one ulp towards it), which a float32 rounding of then
    rounds correctly (float64 has more than 2 x 24 + 2 bits: Boldo and Melquiond's round-to-odd)."""
    p = a.astype(np.float64) * b.astype(np.float64)  # exact
    c = c.astype(np.float64)
    s = p + c
    back = s - p
    error = (p - (s - back)) + (c - back)  # p + c - s, exactly
    even = (s.view(np.int64) & 1) == 0
    s = np.where((error != 0) & even, np.nextafter(s, np.where(error > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def numpy_product(form: str, data: np.ndarray, xq: np.ndarray, xd: np.ndarray) -> np.ndarray:
    """[N, rows]: per block the exact sum of its 32 products (Q6_K's halves each times its int8 scale),
    accumulated as fma(sum, d_w * d_x, acc) in float32, the blocks in order, and Q4_1's bias = fma(m_w, d_x *
    sum(q_x), bias); then acc (+ bias)."""
    rows, n = data.shape[0], xq.shape[0]
    q_w, d_w, m_w, s_w = numpy_weights(form, data)
    q_x = xq.reshape(n, -1, 32).astype(np.int64)  # [N, blocks, 32]
    halves = np.einsum("rkhi,nkhi->nrkh", q_w.reshape(rows, -1, 2, 16), q_x.reshape(n, -1, 2, 16))
    block_sums = (halves * s_w[None]).sum(axis=3)  # [N, rows, blocks]: Q6_K's halves scaled
    assert np.abs(block_sums).max(initial=0) < 2**24  # exact in float32
    block_sums = block_sums.astype(np.float32)  # [N, rows, blocks], exact
    scales = d_w[None] * xd[:, None, :]  # [N, rows, blocks], float32
    sums = xd * q_x.sum(-1).astype(np.float32)  # [N, blocks]: d_x * sum(q_x)
    acc = np.zeros((n, rows), dtype=np.float32)  # [N, rows]
    bias = np.zeros((n, rows), dtype=np.float32)  # [N, rows]
    for k in range(block_sums.shape[2]):
        if form in WITH_MINIMUMS:
            bias = fma32(np.broadcast_to(m_w[None, :, k], bias.shape), sums[:, k, None], bias)
        acc = fma32(block_sums[:, :, k], scales[:, :, k], acc)
    return acc + bias if form in WITH_MINIMUMS else acc


def quantized(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    xq = np.empty(x.shape, dtype=np.int8)  # [N, cols]
    xd = np.empty((x.shape[0], x.shape[1] // 32), dtype=np.float32)  # [N, blocks]
    integer.quantize_q8_rows(x, 32, xq, xd)
    return xq, xd


def sums_of(xq: np.ndarray, xd: np.ndarray) -> np.ndarray:
    xs = np.empty_like(xd)  # [N, blocks]
    integer.block_sums(xq, xd, 32, xs)
    return xs


@pytest.mark.parametrize("n", [1, 3])
def test_activations_quantize_as_ggml_does_bit_for_bit(n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal((n, 256), dtype=np.float32)  # [N, 256]
    x[0, 32:64] = 0.0  # a block of zeros: scale 0, quants 0
    x[0, 64] = 127.5 * np.abs(x[0, 65:96]).max() / 127  # a block whose largest value is its own
    xq, xd = quantized(x)
    want_q, want_d = numpy_quantized(x)
    np.testing.assert_array_equal(xq, want_q)
    np.testing.assert_array_equal(xd.view(np.uint32), want_d.view(np.uint32))
    assert xd[0, 1] == 0 and not xq[0, 32:64].any() and np.abs(xq).max() == 127
    want_sums = want_d * want_q.reshape(n, -1, 32).astype(np.int64).sum(-1).astype(np.float32)
    np.testing.assert_array_equal(sums_of(xq, xd).view(np.uint32), want_sums.view(np.uint32))


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(("n", "cols"), [(1, 1024), (2, 768), (4, 2048)])
def test_the_reference_equals_numpys_bit_for_bit(form, n, cols):
    rng = np.random.default_rng(cols + n)
    data = block_rows(form, rng, 13, cols)  # [13, ...]
    xq, xd = quantized(rng.standard_normal((n, cols), dtype=np.float32))
    out = np.full((n, 15), np.nan, dtype=np.float32)  # rows 2..11 land in columns 1..10, a strided view
    integer.product_blocks(arm.form_id(form), data, f16_table(), 32, xq, xd, sums_of(xq, xd), 2, 12, out[:, 1:11])
    want = numpy_product(form, data[2:12], xq, xd)
    np.testing.assert_array_equal(out[:, 1:11].view(np.uint32), want.view(np.uint32))
    assert np.isnan(out[:, 0]).all() and np.isnan(out[:, 11:]).all()


@pytest.mark.parametrize("form", FORMS)
def test_the_integer_product_is_the_exact_one_within_the_activations_rounding(form):
    """Each activation moves by at most half its block's step (d_x / 2): the product by at most the sum over
    blocks of sum|w| * d_x / 2, plus float32's own rounding."""
    rng = np.random.default_rng(5)
    data = block_rows(form, rng, 64, 2048)  # [64, ...]
    x = rng.standard_normal((2, 2048), dtype=np.float32)  # [2, 2048]
    xq, xd = quantized(x)
    out = np.empty((2, 64), dtype=np.float32)
    integer.product_blocks(arm.form_id(form), data, f16_table(), 32, xq, xd, sums_of(xq, xd), 0, 64, out)
    q_w, d_w, m_w, s_w = numpy_weights(form, data)
    q_w = q_w * np.repeat(s_w, 16, axis=-1)  # Q6_K's int8 scales a 16 weights
    weights = q_w * d_w[..., None].astype(np.float64) + m_w[..., None]  # [64, blocks, 32]
    exact = np.einsum("rki,nki->nr", weights, x.reshape(2, -1, 32).astype(np.float64))  # [2, 64]
    bound = np.einsum("rk,nk->nr", np.abs(weights).sum(-1), xd.astype(np.float64) / 2)  # [2, 64]
    slack = 1e-5 * np.einsum("rki,nki->nr", np.abs(weights), np.abs(x.reshape(2, -1, 32)))
    error = np.abs(out - exact)
    assert np.all(error <= bound + slack)
    assert error.max() > 0  # the activations were rounded: not the exact product


def _sdot_runs() -> bool:
    """Whether this host executes the sdot kernel: the plan's runnable integer variants (_kernels.plan);
    compiled elsewhere, LLVM could not even select the instruction."""
    from kestrel_trio._kernels.plan import this_plan

    return _kernels.ready() and "neon-dotprod" in this_plan().integer.runnable


# The aarch64 kernels by the plan's names: the widening one is plain vector IR that any CPU runs (x86-64's too),
# sdot only where the CPU has dotprod (skipped elsewhere, marked host_cpu).
ARM_KERNELS = {"neon": "product_widening", "neon-dotprod": "product_sdot"}
EACH_ARM_KERNEL = ["neon", pytest.param("neon-dotprod", marks=[pytest.mark.host_cpu, pytest.mark.skipif(
    not _sdot_runs(), reason="no dotprod on this CPU (or not aarch64): sdot cannot run")])]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(("n", "rows", "cols"), [(1, 13, 1024), (2, 4, 768), (3, 9, 2048), (1, 3, 256),
                                                  (2, 21, 256)])
@pytest.mark.parametrize("variant", EACH_ARM_KERNEL)
def test_the_arm_kernels_equal_the_reference_bit_for_bit(variant, form, n, rows, cols):
    """Eight rows a pass (Q8_0, Q4_0 with sdot), four, and the rows left one by one, into a strided view of a
    wider result."""
    rng = np.random.default_rng(rows * cols + n)
    data = block_rows(form, rng, rows + 3, cols)  # [rows + 3, ...]
    xq, xd = quantized(rng.standard_normal((n, cols), dtype=np.float32))
    xs = sums_of(xq, xd)
    want = np.empty((n, rows), dtype=np.float32)
    integer.product_blocks(arm.form_id(form), data, f16_table(), 32, xq, xd, xs, 2, 2 + rows, want)
    out = np.full((n, rows + 2), np.nan, dtype=np.float32)
    getattr(arm, ARM_KERNELS[variant])(arm.form_id(form), data, xq, xd, xs, 2, 2 + rows, out[:, 1 : 1 + rows])
    np.testing.assert_array_equal(out[:, 1 : 1 + rows].view(np.uint32), want.view(np.uint32))
    assert np.isnan(out[:, 0]).all() and np.isnan(out[:, -1]).all()


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("n", [1, 6, 16])
@pytest.mark.parametrize("variant", EACH_ARM_KERNEL)
def test_extreme_scales_zero_blocks_and_up_to_16_activation_rows_bit_for_bit(variant, form, n):
    """Float16 scales from 0 through subnormals to 65504 of either sign, every fourth block all zeros,
    activations spanning six decades a block with a block of zeros, an odd row count from an odd start: numpy,
    the reference and each kernel this CPU runs agree bit for bit."""
    rng = np.random.default_rng(n + 100 * FORMS.index(form))
    rows, cols = 11, 1024
    data = extreme_rows(form, rng, rows + 4, cols)  # [rows + 4, ...]
    x = rng.standard_normal((n, cols), dtype=np.float32)  # [N, cols]
    x *= np.repeat(10.0 ** rng.uniform(-3, 3, (n, cols // 32)), 32, axis=1).astype(np.float32)
    x[:, 64:96] = 0.0  # a block of zeros: scale 0
    xq, xd = quantized(x)
    xs = sums_of(xq, xd)
    want = np.empty((n, rows), dtype=np.float32)
    integer.product_blocks(arm.form_id(form), data, f16_table(), 32, xq, xd, xs, 3, 3 + rows, want)
    assert np.isfinite(want).all() and (want != 0).any()
    np.testing.assert_array_equal(want.view(np.uint32), numpy_product(form, data[3 : 3 + rows], xq, xd).view(np.uint32))
    out = np.full((n, rows), np.nan, dtype=np.float32)
    getattr(arm, ARM_KERNELS[variant])(arm.form_id(form), data, xq, xd, xs, 3, 3 + rows, out)
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))


def _assembly(kernel, *args) -> str:
    """The aarch64 assembly of ``kernel`` compiled afresh for ``args``: a kernel loaded from numba's cache (the lane
    keeps one between runs) has no assembly to inspect."""
    fresh = numba.njit(nogil=True)(kernel.py_func)
    fresh(*args)
    return "\n".join(fresh.inspect_asm().values())


@pytest.mark.host_cpu
@pytest.mark.skipif(platform.machine() not in ("aarch64", "arm64"), reason="aarch64's dot-product instructions")
def test_on_aarch64_the_block_sums_compile_to_sdot_exactly_where_the_cpu_has_dotprod():
    rng = np.random.default_rng(1)
    data = block_rows("Q8_0", rng, 5, 64)
    xq, xd = quantized(rng.standard_normal((1, 64), dtype=np.float32))
    args = (0, data, xq, xd, xd, 0, 5, np.empty((1, 5), dtype=np.float32))
    if cpu.this_cpu().has("dotprod"):  # cortex-a76 in the aarch64 lane: the board's code
        # two a block of 32 and row, in each form's four-row and one-row kernels: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 one
        # block, Q4_K, Q5_K, Q6_K eight (Q6_K's two, one a 16 weights)
        assert _assembly(arm.product_sdot, *args).count("sdot") >= 5 * (2 * 4 + 2) + 3 * 8 * (2 * 4 + 2)
    else:  # cortex-a53: code without the instruction, which the emulated core would refuse (SIGILL)
        assert _assembly(arm.product_widening, *args).count("sdot") == 0


@pytest.mark.parametrize("form", FORMS)
def test_a_product_takes_the_integer_kernel_of_its_mode(form):
    """Through the products' dispatch (kestrel_trio._kernels.packed_product): in the integer mode the kernel this
    CPU gets, equal to the reference on the same quantized activations; in the exact mode the float32 one."""
    rng = np.random.default_rng(7)
    data = block_rows(form, rng, 10, 256)  # [10, 8 blocks]
    x = rng.standard_normal((2, 256), dtype=np.float32)  # [2, 256]
    xq, xd = quantized(x)
    want = np.empty((2, 10), dtype=np.float32)
    integer.product_blocks(arm.form_id(form), data, f16_table(), 32, xq, xd, sums_of(xq, xd), 0, 10, want)
    expected = {"aarch64": "sdot" if cpu.this_cpu().has("dotprod") else "neon"}.get(platform.machine(), "int8")
    if platform.machine() == "x86_64":  # kestrel_trio._kernels.x86's, where numba's code and the CPU take one
        from kestrel_trio._kernels.x86 import integer as x86

        kind = x86.usable_kernel(cpu.this_cpu().has)
        expected = x86.KINDS[kind] if kind is not None and form in x86.FORMS else "int8"
    out = np.empty((2, 10), dtype=np.float32)
    _kernels.packed_product(form, data, None, x, 0, 10, out, mode="integer")
    assert _kernels.product_kernels([form], "integer") == {form: expected}
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))
    shared = _kernels.quantize_activations(x, ["F32", form], "integer")  # once for every product taking x
    again = np.empty((2, 10), dtype=np.float32)
    _kernels.packed_product(form, data, None, x, 0, 10, again, shared, mode="integer")
    np.testing.assert_array_equal(again.view(np.uint32), want.view(np.uint32))
    assert (shared[2] is not None) == (form in WITH_MINIMUMS)  # the sums only where minimums take them
    assert _kernels.quantize_activations(x, [form], "exact") is None
    _kernels.packed_product(form, data, None, x, 0, 10, out, mode="exact")
    assert _kernels.product_kernels([form], "exact") == {form: "portable"}
    assert not np.array_equal(out, want)  # the exact product: activations not rounded
    with pytest.raises(ValueError, match="products must be one of auto, exact, integer"):
        Backend(products="fast")
