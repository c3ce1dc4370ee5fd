"""A decode step's activations quantized for the integer products, with their block sums, in one compiled call.

A decode step of one sequence quantizes three activation rows a layer (the
normed hidden state, the attention output, the MLP's activation); the
general path's quantization (kestrel_trio._kernels.products.quantize) is two
compiled calls and three new arrays each time. Here it is one call into the
step's own buffers (kestrel_trio._model.decode_step). The arithmetic is
integer.quantize_q8_rows' and integer.block_sums', written out (numba
re-validates a cached function when its own file changes, not when a
function it calls from another file does), without fastmath as there: the
scale, the rounding and the integer sums are the same bit for bit
(tests/model/test_decode_step.py checks it).

The RMS norms stay kestrel_trio._kernels.norm's own compiled function,
called with the general path's argument types: its sum of squares is
reassociated, and a copy of the loop, or a caller it were inlined into, may
vectorize it in another order (a fused norm-and-quantize here differed from
it in the last bit on a fixture's rows).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["quantize_rows"]


@njit(nogil=True, cache=True)
def quantize_rows(x, run, xq, xd, xs, sums):
    """Each row of ``x`` float32 [N, cols] (C-contiguous) in blocks of ``run`` (32) to ``xq`` int8 [N, cols] and
    ``xd`` float32 [N, cols / run] (integer.quantize_q8_rows' arithmetic); with ``sums``, ``xs`` [N, cols / run]
    the blocks' sums ``d_x * sum(q_x)`` (integer.block_sums')."""
    n, cols = x.shape
    for b in range(n):
        for block in range(cols // run):
            first = block * run
            amax = np.float32(0.0)
            for i in range(run):
                amax = max(amax, abs(x[b, first + i]))
            d = amax / np.float32(127.0)
            inverse = np.float32(1.0) / d if d > 0 else np.float32(0.0)
            xd[b, block] = d
            for i in range(run):
                xq[b, first + i] = np.int8(np.rint(x[b, first + i] * inverse))
            if sums:
                total = np.int32(0)
                for i in range(first, first + run):
                    total += np.int32(xq[b, i])
                xs[b, block] = xd[b, block] * np.float32(total)
