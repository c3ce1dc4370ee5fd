"""A decode step's loops between its integer products, each one compiled call (numba).

Theory of operation: a decode step of one sequence runs a handful of
activation values through dozens of small operations a layer. Called one
by one from Python, each costs more in dispatch than in arithmetic: a
30-layer SmolLM2-135M step made about 16,600 Python-level calls, 43.5 M of
its 80.8 M aarch64 instructions (counted under qemu). Here the operations
that sit between two products are one call each:

- :func:`norm_quantize`: a layer's RMS norm and the int8 quantization of the
  normed row for the integer products (``h``, ``xq``, ``xd``, ``xs``);
- :func:`add_norm_quantize`: the residual add in place, then the same;
- :func:`quantize_rows`: an attention output or an MLP activation quantized.

The arithmetic is written out here, not called from kestrel_trio._kernels.norm
and kestrel_trio._kernels.integer: numba re-validates a cached function when
its own file changes, not when a function it calls from another file does. It
is theirs step for step, with the same compiler flags (the sum of squares
reassociated as norm.rms_norm's; the quantization without fastmath as
integer.quantize_q8_rows'), so the results equal them bit for bit
(tests/model/test_decode_step.py checks it).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["norm_quantize", "add_norm_quantize", "quantize_rows"]


@njit(nogil=True, cache=True, error_model="numpy", fastmath={"reassoc", "nsz"})
def _norm(x, weight, eps, h):
    """``h`` [N, d] = x * rsqrt(mean(x^2) + ``eps``) * ``weight`` [d] for ``x`` [N, d], C-contiguous (norm.rms_norm's
    arithmetic: its reassociated, vectorized sum of squares, then the two products rounded in its order)."""
    n, dim = x.shape
    flat = x.reshape(n * dim)  # [N*d], a view
    for a in range(n):
        row = flat[a * dim : a * dim + dim]  # a slice: no negative-index wraparound per element, so it vectorizes
        total = np.float32(0.0)
        for i in range(dim):
            total += row[i] * row[i]
        scale = np.float32(1.0) / np.sqrt(total / np.float32(dim) + eps)
        for i in range(dim):
            h[a, i] = row[i] * scale * weight[i]


@njit(nogil=True, cache=True)
def _quantize(x, run, xq, xd, xs, sums):
    """Each row of ``x`` float32 [N, cols] in blocks of ``run`` (32) to ``xq`` int8 [N, cols] and ``xd`` float32
    [N, cols / run] (integer.quantize_q8_rows' arithmetic); with ``sums``, ``xs`` [N, cols / run] the blocks'
    sums ``d_x * sum(q_x)`` (integer.block_sums')."""
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


@njit(nogil=True, cache=True)
def norm_quantize(x, weight, eps, run, h, xq, xd, xs, sums):
    """``h`` [N, d] = rms_norm(``x`` [N, d]) * ``weight`` [d] (float32 ``eps``), quantized into ``xq``, ``xd``
    (and with ``sums`` ``xs``) as :func:`_quantize` says. All float32 C-contiguous but ``xq`` (int8)."""
    _norm(x, weight, eps, h)
    _quantize(h, run, xq, xd, xs, sums)


@njit(nogil=True, cache=True)
def add_norm_quantize(x, delta, weight, eps, run, h, xq, xd, xs, sums):
    """``x`` += ``delta`` (both [N, d]: the residual stream, in place), then :func:`norm_quantize` of ``x``."""
    n, dim = x.shape
    for a in range(n):
        for i in range(dim):
            x[a, i] += delta[a, i]
    _norm(x, weight, eps, h)
    _quantize(h, run, xq, xd, xs, sums)


@njit(nogil=True, cache=True)
def quantize_rows(x, run, xq, xd, xs, sums):
    """``x`` float32 [N, cols] quantized into ``xq``, ``xd`` (with ``sums``: ``xs``), as :func:`_quantize` says."""
    _quantize(x, run, xq, xd, xs, sums)
