"""Causal attention of a float32 prefill chunk on Intel CPUs with AVX-512, one key/value head at a time.

Theory of operation: numpy's way (kestrel_trio._model.layers) runs a block of
queries through two small sgemms with four passes between them (the causal
mask, the row maxima, the exponentials, the division), and copies the
queries and the output between layouts. Here each key/value head of a
thread's share goes through, in one compiled call:

1. Its queries, scaled, as rows in (query, group) order (``[rows, head_dim]``,
   rows padded with zeros to a multiple of 14); its keys packed as
   f32_chunks packs activations (``[keys/32, head_dim, 32]``, zero keys
   after the last), its values in columns of 32 (``[head_dim/32, keys, 32]``,
   zero after the last: a score of 0 times garbage would be NaN).
2. 14 rows at a time (one register block of the row kernel): their scores
   over the keys their last query sees, by f32_chunks' row kernel (out's
   rows are the queries', each block of 32 keys two stores, no staging).
   Taking the keys 14 rows at a time rather than 126 leaves fewer scores
   past the diagonal to compute: a 256-token chunk's attention 1.73-1.74 ms
   against 1.85-1.88 on two threads, 3.56-3.70 against 3.64-3.76 after 256
   tokens.
3. Each row's softmax numerators over its own keys: the causal mask is the
   row's key count, every score after it set to 0. The row maximum takes
   16 running maxima (LLVM vectorizes that loop; a plain max reduction it
   does not), the exponentials kestrel_trio._kernels.exp's.
4. The numerators times the values by the same row kernel, and each output
   row divided by its sum into ``out``.

The 14 rows' scores (28 KiB over 512 keys) stay in L1, the packed keys and
values in L2. Measured on the 2-core Xeon with AMX (2026-12-05,
Qwen3-0.6B's heads: 16 query heads over 8, head_dim 128): the row kernel
ran the scores and the weighted sums at 193-209 GFLOP/s on one thread
(OpenBLAS's sgemm 96-168 on these shapes); a 256-token chunk after 256
tokens took 3.6 ms on two threads against 8.8 for numpy's way. A whole
prefill, alternated 8 times in one process: 512 tokens 1775-1830 ms against
1822-1962, 128 tokens 447-475 against 455-485.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kestrel_trio._kernels.exp import _exp
from kestrel_trio._kernels.f32_chunks import ACTIVATION_ROWS, WEIGHT_ROWS, _store_rows

__all__ = ["attend_heads"]

_FAST = dict(nogil=True, cache=True, error_model="numpy", fastmath={"reassoc", "nsz", "contract", "arcp"})
_LANES = 16  # running maxima of a row: one zmm


@njit(**_FAST)
def attend_heads(q, keys, values, past, scale, out, first, stop):
    """Causal attention of T new queries over their kv heads [first, stop), into ``out``'s columns of those heads.

    Args:
        q: float32 [T, n_heads, head_dim], the T newest tokens' queries (any strides).
        keys: float32 [n_kv, past + T, head_dim], every key so far (any strides); ``values`` as ``keys``.
        past: keys before the new tokens'.
        scale: float32, the score multiplier.
        out: float32 [T, n_heads * head_dim]; query head j reads kv head j // (n_heads / n_kv).
        first, stop: the kv heads to attend.
    """
    t, n_heads, head_dim = q.shape
    group = n_heads // keys.shape[0]
    total = past + t
    rows = t * group
    rows_padded = -(-rows // WEIGHT_ROWS) * WEIGHT_ROWS
    key_blocks = -(-total // ACTIVATION_ROWS)
    queries = np.zeros((rows_padded, head_dim), np.float32)  # [rows, head_dim], zero past the last
    packed_keys = np.empty((key_blocks, head_dim, ACTIVATION_ROWS), np.float32)  # [keys/32, head_dim, 32]
    packed_values = np.empty((head_dim // ACTIVATION_ROWS, key_blocks * ACTIVATION_ROWS, ACTIVATION_ROWS),
                             np.float32)  # [head_dim/32, keys, 32]
    scores = np.empty((WEIGHT_ROWS, key_blocks * ACTIVATION_ROWS), np.float32)  # [14, keys]
    weighted = np.empty((WEIGHT_ROWS, head_dim), np.float32)  # [14, head_dim]
    sums = np.empty(WEIGHT_ROWS, np.float32)  # [14]
    maxima = np.empty(_LANES, np.float32)  # [16]
    operands = np.zeros(12, np.int64)
    for head in range(first, stop):
        _pack_head(q, keys, values, head, group, scale, queries, packed_keys, packed_values)
        for start in range(0, rows_padded, WEIGHT_ROWS):  # 14 rows at a time: one register block's
            end = min(start + WEIGHT_ROWS, rows)  # past the last row: padding
            seen = past + (end - 1) // group + 1  # keys the last query of these rows sees
            width = -(-seen // ACTIVATION_ROWS) * ACTIVATION_ROWS
            _rows_product(queries[start : start + WEIGHT_ROWS], packed_keys, scores, head_dim,
                          width // ACTIVATION_ROWS, operands)
            for r in range(WEIGHT_ROWS):
                own = min(past + (start + r) // group + 1, seen)  # keys row r's query sees: the causal mask
                sums[r] = _softmax_numerators(scores, r, own, width, maxima)
            _rows_product(scores, packed_values, weighted, width, head_dim // ACTIVATION_ROWS, operands)
            for r in range(end - start):
                token, column = (start + r) // group, (head * group + (start + r) % group) * head_dim
                _store_row(weighted[r], sums[r], out, token, column)


@njit(**_FAST)
def _pack_head(q, keys, values, head, group, scale, queries, packed_keys, packed_values):
    """kv head ``head``'s scaled queries, packed keys and values into the buffers (see the module's docstring)."""
    t, _, head_dim = q.shape
    total = keys.shape[1]
    for r in range(t * group):
        for d in range(head_dim):
            queries[r, d] = q[r // group, head * group + r % group, d] * scale
    whole = total // ACTIVATION_ROWS
    for b in range(whole):  # whole blocks of keys, then the last part-block with zero keys after the last
        for d in range(head_dim):
            for lane in range(ACTIVATION_ROWS):
                packed_keys[b, d, lane] = keys[head, b * ACTIVATION_ROWS + lane, d]
    if whole < packed_keys.shape[0]:
        packed_keys[whole] = 0
        for d in range(head_dim):
            for key in range(whole * ACTIVATION_ROWS, total):
                packed_keys[whole, d, key - whole * ACTIVATION_ROWS] = keys[head, key, d]
    for c in range(packed_values.shape[0]):
        for key in range(total):
            for lane in range(ACTIVATION_ROWS):
                packed_values[c, key, lane] = values[head, key, c * ACTIVATION_ROWS + lane]
        packed_values[c, total:] = 0


@njit(nogil=True, cache=True)
def _rows_product(w, packed, out, k, blocks, operands):
    """``out[:n, :blocks*32] = w[:n, :k] @ packed[:blocks, :k].T`` (n = w's rows, a multiple of 14), by
    f32_chunks' row kernel. ``packed``: [blocks, >= k, 32], C-contiguous; ``operands``: int64 [12] scratch."""
    operands[1], operands[6], operands[9] = w.strides[0], out.strides[0], packed.strides[0]
    operands[2], operands[4], operands[7] = packed.ctypes.data, k, blocks
    for first in range(0, w.shape[0], WEIGHT_ROWS):
        operands[0] = w.ctypes.data + first * w.strides[0]
        operands[5] = out.ctypes.data + first * out.strides[0]
        _store_rows(operands.ctypes.data)


@njit(nogil=True, cache=True, error_model="numpy", fastmath={"reassoc", "nsz", "nnan"})
def _row_maximum(scores, r, count, maxima):
    """The largest of ``scores[r, :count]`` (count >= 1), by 16 running maxima. No-NaN lets LLVM vectorize; a NaN
    score makes its own numerator NaN in the next pass, and so the row's sum and output, whatever this gives."""
    maxima[:] = scores[r, 0]
    whole = count - count % _LANES
    for j in range(0, whole, _LANES):
        for lane in range(_LANES):
            value = scores[r, j + lane]
            maxima[lane] = value if value > maxima[lane] else maxima[lane]
    top = maxima[0]
    for lane in range(1, _LANES):
        top = maxima[lane] if maxima[lane] > top else top
    for j in range(whole, count):
        top = scores[r, j] if scores[r, j] > top else top
    return top


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
