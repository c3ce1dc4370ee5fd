"""Causal attention of a float32 prefill chunk in assembly blocks (AVX-512 or AVX2), one key/value head at a time.

Theory of operation: numpy's way (kestrel_trio._model.decoder.layers) runs a block of
queries through two small sgemms with four passes between them (the causal
mask, the row maxima, the exponentials, the division), and copies the
queries and the output between layouts. Here each key/value head of a
thread's share goes through, in one compiled call, with a register block of
R weight rows x L activation lanes (AVX-512: f32_chunks' row kernel, 14 x
32; AVX2: :func:`_avx2_row_text`, 6 x 16):

1. Its queries, scaled, as rows in (query, group) order (``[rows, head_dim]``,
   rows padded with zeros to a multiple of R); its keys packed as
   f32_chunks packs activations (``[keys/L, head_dim, L]``, zero keys
   after the last), its values in columns of L (``[head_dim/L, keys, L]``,
   zero after the last: a score of 0 times garbage would be NaN).
2. R rows at a time (one register block): their scores over the keys their
   last query sees, by the row kernel (out's rows are the queries', each
   block of L keys stored whole, no staging). Taking the keys 14 rows at a
   time rather than 126 leaves fewer scores past the diagonal to compute: a
   256-token chunk's attention 1.73-1.74 ms against 1.85-1.88 on two
   threads, 3.56-3.70 against 3.64-3.76 after 256 tokens (AVX-512).
3. Each row's softmax numerators over its own keys: the causal mask is the
   row's key count, every score after it set to 0. The row maximum takes
   16 running maxima (LLVM vectorizes that loop; a plain max reduction it
   does not), the exponentials kestrel_trio._kernels.portable.exp's; with AVX-512's
   block, kestrel_trio._kernels.x86.float32.exp's assembly does a block's rows.
4. The numerators times the values by the same row kernel, and each output
   row divided by its sum into ``out``.

The R rows' scores (28 KiB over 512 keys at R = 14) stay in L1, the packed
keys and values in L2: on the 2-core Xeon with AMX (Qwen3-0.6B's heads) a
256-token chunk after 256 tokens took 3.6 ms on two threads against 8.8 for
numpy's way (AVX2 block: 5.33 against 16.0). Not measured on an AVX2-only CPU
or a Zen; the other figures are in docs/notes/performance-log.md.
"""
from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import intrinsic, overload

from kestrel_trio._kernels.x86.float32 import chunks as f32_chunks, exp as f32_exp
from kestrel_trio._kernels.portable.exp import _exp
from kestrel_trio._kernels.x86.float32.assembly import _asm_codegen

__all__ = ["attend_heads_avx512", "attend_heads_avx2", "LANES", "block_rows"]

_FAST = dict(nogil=True, cache=True, error_model="numpy", fastmath={"reassoc", "nsz", "contract", "arcp"})
_MAXIMA = 16  # running maxima of a row: one zmm, two ymm
# The register blocks, by the activation lanes a block takes (``lanes``, a compile-time constant of every function
# below): AVX-512's 14 weight rows x 32 (f32_chunks' row kernel, 28 zmm sums), AVX2's 6 x 16 (12 ymm sums).
LANES = (f32_chunks.ACTIVATION_ROWS, 16)
_AVX2_ROWS = 6
_AVX2_PREFETCH = 512  # bytes ahead the packed activations are asked into L1


@njit(cache=True)
def block_rows(lanes):
    """Weight rows of the register block that takes ``lanes`` activation lanes (one of LANES)."""
    return f32_chunks.WEIGHT_ROWS if lanes == f32_chunks.ACTIVATION_ROWS else _AVX2_ROWS


@njit(**_FAST)
def attend_heads_avx512(q, keys, values, past, scale, out, first, stop):
    """:func:`_attend_heads` with AVX-512's register block."""
    _attend_heads(q, keys, values, past, scale, out, first, stop, 32)  # LANES[0], as a literal


@njit(**_FAST)
def attend_heads_avx2(q, keys, values, past, scale, out, first, stop):
    """:func:`_attend_heads` with AVX2's register block."""
    _attend_heads(q, keys, values, past, scale, out, first, stop, 16)  # LANES[1], as a literal


@njit(**_FAST)
def _attend_heads(q, keys, values, past, scale, out, first, stop, lanes):
    """Causal attention of T new queries over their kv heads [first, stop), into ``out``'s columns of those heads.

    Args:
        q: float32 [T, n_heads, head_dim], the T newest tokens' queries (any strides).
        keys: float32 [n_kv, past + T, head_dim], every key so far (any strides); ``values`` as ``keys``.
        past: keys before the new tokens'.
        scale: float32, the score multiplier.
        out: float32 [T, n_heads * head_dim]; query head j reads kv head j // (n_heads / n_kv).
        first, stop: the kv heads to attend.
        lanes: the register block, one of LANES (32: AVX-512, 16: AVX2), a constant: each value compiles its own
            code (:func:`_row_block` types only a literal).
    """
    rows_per = block_rows(lanes)
    t, n_heads, head_dim = q.shape
    group = n_heads // keys.shape[0]
    total = past + t
    rows = t * group
    rows_padded = -(-rows // rows_per) * rows_per
    key_blocks = -(-total // lanes)
    queries = np.zeros((rows_padded, head_dim), np.float32)  # [rows, head_dim], zero past the last
    packed_keys = np.empty((key_blocks, head_dim, lanes), np.float32)  # [keys/lanes, head_dim, lanes]
    packed_values = np.empty((head_dim // lanes, key_blocks * lanes, lanes), np.float32)  # [hd/lanes, keys, lanes]
    scores = np.empty((rows_per, key_blocks * lanes), np.float32)  # [rows_per, keys]
    weighted = np.empty((rows_per, head_dim), np.float32)  # [rows_per, head_dim]
    sums = np.empty(rows_per, np.float32)  # [rows_per]
    maxima = np.empty(_MAXIMA, np.float32)  # [16]
    counts = np.empty(rows_per, np.int64)  # [rows_per]: the keys each row's query sees
    operands = np.zeros(max(f32_chunks.OPERANDS, f32_exp.OPERANDS), np.int64)
    for head in range(first, stop):
        _pack_head(q, keys, values, head, group, scale, queries, packed_keys, packed_values, lanes)
        for start in range(0, rows_padded, rows_per):  # a register block's rows at a time
            end = min(start + rows_per, rows)  # past the last row: padding
            seen = past + (end - 1) // group + 1  # keys the last query of these rows sees
            width = -(-seen // lanes) * lanes
            _rows_product(queries[start : start + rows_per], packed_keys, scores, head_dim, width // lanes, operands,
                          lanes)
            for r in range(rows_per):
                counts[r] = min(past + (start + r) // group + 1, seen)  # keys row r's query sees: the causal mask
            _softmax_block(scores, counts, width, sums, maxima, operands, lanes)
            _rows_product(scores, packed_values, weighted, width, head_dim // lanes, operands, lanes)
            for r in range(end - start):
                token, column = (start + r) // group, (head * group + (start + r) % group) * head_dim
                _store_row(weighted[r], sums[r], out, token, column)


@njit(**_FAST)
def _pack_head(q, keys, values, head, group, scale, queries, packed_keys, packed_values, lanes):
    """kv head ``head``'s scaled queries, packed keys and values into the buffers (see the module's docstring)."""
    t, _, head_dim = q.shape
    total = keys.shape[1]
    for r in range(t * group):
        for d in range(head_dim):
            queries[r, d] = q[r // group, head * group + r % group, d] * scale
    whole = total // lanes
    for b in range(whole):  # whole blocks of keys, then the last part-block with zero keys after the last
        for d in range(head_dim):
            for lane in range(lanes):
                packed_keys[b, d, lane] = keys[head, b * lanes + lane, d]
    if whole < packed_keys.shape[0]:
        packed_keys[whole] = 0
        for d in range(head_dim):
            for key in range(whole * lanes, total):
                packed_keys[whole, d, key - whole * lanes] = keys[head, key, d]
    for c in range(packed_values.shape[0]):
        for key in range(total):
            for lane in range(lanes):
                packed_values[c, key, lane] = values[head, key, c * lanes + lane]
        packed_values[c, total:] = 0


@njit(nogil=True, cache=True)
def _rows_product(w, packed, out, k, blocks, operands, lanes):
    """``out[:n, :blocks*lanes] = w[:n, :k] @ packed[:blocks, :k].T`` (n = w's rows, a multiple of the block's
    rows), by the row kernel of ``lanes``. ``packed``: [blocks, >= k, lanes], C-contiguous; ``operands``: int64
    [OPERANDS] scratch (f32_chunks' layout)."""
    operands[1], operands[6], operands[9] = w.strides[0], out.strides[0], packed.strides[0]
    operands[2], operands[4], operands[7], operands[8] = packed.ctypes.data, k, blocks, 4 * lanes
    for first in range(0, w.shape[0], block_rows(lanes)):
        operands[0] = w.ctypes.data + first * w.strides[0]
        operands[5] = out.ctypes.data + first * out.strides[0]
        _row_block(operands.ctypes.data, lanes)


@intrinsic
def _row_block(typingctx, operands, lanes):
    """One call of the row kernel of literal ``lanes``: f32_chunks' (32) or :func:`_avx2_row_text`'s (16). Only the
    one asked for is assembled, so a CPU without AVX-512 never meets a zmm instruction."""
    if not isinstance(lanes, types.IntegerLiteral) or lanes.literal_value not in LANES:
        return None
    if lanes.literal_value == f32_chunks.ACTIVATION_ROWS:
        assembly = _asm_codegen(f32_chunks._row_text(next_rows=False), f32_chunks._CLOBBERED)
    else:
        assembly = _asm_codegen(_avx2_row_text(), [f"ymm{i}" for i in range(16)])

    def codegen(context, builder, signature, args):  # the assembly takes the operands' address alone
        return assembly(context, builder, signature, args[:1])
    return types.void(operands, lanes), codegen


def _avx2_row_text() -> str:
    """f32_chunks' row kernel in ymm: 6 weight rows x 16 activation lanes, 12 sums (ymm0-11), activations in ymm12-13,
    the broadcast in ymm14. Operands as f32_chunks._row_text's (8: the bytes from one block's sums in out to the
    next's)."""
    sums = [f"%ymm{a}" for a in range(2 * _AVX2_ROWS)]
    rows = ["(%r8)", "(%r8,%r9,1)", "(%r8,%r9,2)", "(%r8,%r12,1)", "(%r13)", "(%r13,%r9,1)"]
    lines = ["mov 8($0), %r9", "lea (%r9,%r9,2), %r12", "mov 48($0), %rdi", "mov 40($0), %rsi", "mov 56($0), %rax",
             "mov 16($0), %rdx", "mov %rdx, 24($0)",
             "2:", "mov 0($0), %r8", "lea (%r8,%r9,4), %r13", "mov 24($0), %r10", "mov 32($0), %rcx", "shr $$2, %rcx"]
    lines += [f"vxorps {s}, {s}, {s}" for s in sums]
    lines.append("1:")
    lanes = LANES[1]
    for u in range(f32_chunks.K_STEP):
        at = 4 * lanes * u
        lines += [f"vmovups {at}(%r10), %ymm12", f"vmovups {at + 32}(%r10), %ymm13",
                  f"prefetcht0 {_AVX2_PREFETCH + at}(%r10)"]
        for i, row in enumerate(rows):
            lines += [f"vbroadcastss {4 * u if u else ''}{row}, %ymm14", f"vfmadd231ps %ymm12, %ymm14, {sums[2 * i]}",
                      f"vfmadd231ps %ymm13, %ymm14, {sums[2 * i + 1]}"]
    lines += [f"add $${4 * f32_chunks.K_STEP}, %{r}" for r in ("r8", "r13")]
    lines += [f"add $${4 * lanes * f32_chunks.K_STEP}, %r10", "dec %rcx", "jnz 1b", "mov %rsi, %r13"]
    for i in range(_AVX2_ROWS):
        lines += [f"vmovups {sums[2 * i]}, (%r13)", f"vmovups {sums[2 * i + 1]}, 32(%r13)", "add %rdi, %r13"]
    lines += ["add 64($0), %rsi", "mov 72($0), %rdx", "add %rdx, 24($0)", "dec %rax", "jnz 2b", "vzeroupper"]
    return "\n".join(lines)


@njit(nogil=True, cache=True, error_model="numpy", fastmath={"reassoc", "nsz", "nnan"})
def _row_maximum(scores, r, count, maxima):
    """The largest of ``scores[r, :count]`` (count >= 1), by 16 running maxima. No-NaN lets LLVM vectorize; a NaN
    score makes its own numerator NaN in the next pass, and so the row's sum and output, whatever this gives."""
    maxima[:] = scores[r, 0]
    whole = count - count % _MAXIMA
    for j in range(0, whole, _MAXIMA):
        for lane in range(_MAXIMA):
            value = scores[r, j + lane]
            maxima[lane] = value if value > maxima[lane] else maxima[lane]
    top = maxima[0]
    for lane in range(1, _MAXIMA):
        top = maxima[lane] if maxima[lane] > top else top
    for j in range(whole, count):
        top = scores[r, j] if scores[r, j] > top else top
    return top


def _softmax_block(scores, counts, width, sums, maxima, operands, lanes):
    """A register block's softmax numerators: each row r of ``scores`` as :func:`_softmax_numerators` makes them
    over ``counts[r]`` keys (its sum into ``sums[r]``); by f32_exp's assembly where ``lanes`` is AVX-512's."""
    raise NotImplementedError("compiled only: see _softmax_block_for")


@overload(_softmax_block, prefer_literal=True)
def _softmax_block_for(scores, counts, width, sums, maxima, operands, lanes):
    """:func:`_softmax_block` for the literal ``lanes``: only AVX-512's block meets f32_exp's zmm assembly."""
    if not isinstance(lanes, types.IntegerLiteral):
        return None
    if lanes.literal_value == LANES[0]:
        def assembly(scores, counts, width, sums, maxima, operands, lanes):
            f32_exp.softmax_rows(scores, counts, width, sums, operands)
        return assembly

    def loops(scores, counts, width, sums, maxima, operands, lanes):
        for r in range(scores.shape[0]):
            sums[r] = _softmax_numerators(scores, r, counts[r], width, maxima)
    return loops


@njit(**_FAST)
def _softmax_numerators(scores, r, count, width, maxima):
    """``scores[r, :count]`` to e^(s - their max), ``scores[r, count:width]`` to 0, in place; the numerators' sum.

    Row by index, not a row view: LLVM vectorized neither loop over a view (1 ns an element against 0.3).
    """
    top = _row_maximum(scores, r, count, maxima)
    total = np.float32(0.0)
    for j in range(count):
        e = _exp(scores[r, j] - top)
        scores[r, j] = e
        total += e
    for j in range(count, width):
        scores[r, j] = np.float32(0.0)
    return total


@njit(**_FAST)
def _store_row(weighted, total, out, token, column):
    """``weighted`` [head_dim] / ``total`` into ``out[token, column : column + head_dim]``."""
    for d in range(weighted.shape[0]):
        out[token, column + d] = weighted[d] / total
