"""A prefill chunk's rows held packed between its products (kestrel_trio._kernels.x86.float32.chunks' layout).

Theory of operation: f32_chunks' kernel packs a product's activations
[M, K] into blocks of 32 rows side by side, [M/32, K, 32], and gathers its
sums back into rows of [M, N] through a staging buffer. Its row kernel
stores each weight row's 32 sums of a block whole instead, and stored at
out[b, n] they are the same packed layout, [M/32, N, 32]: the next
product's input as it stands, no pack, no gather. Norms, residual sums and
SwiGLU are token by token, so they run on the packed layout too, a token a
lane. kestrel_trio._model.decoder.packed_layers keeps a chunk packed through its
layers this way, in rows only where attention needs them.

Every function here needs the chunk kernel (``kestrel_trio._kernels.enable_chunk_products()`` is None). Rows
past the last of M in the last block are zeros where :func:`pack` made them; the products keep them apart
(each lane's sums are its own token's), so whatever they hold never reaches another token.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kestrel_trio._kernels.portable.spans import run_spans

__all__ = ["pack", "unpack", "product", "product_of_rows", "product_rows", "rms_norm", "swiglu", "LANES", "Then"]

LANES = 32  # tokens a block: f32_chunks.ACTIVATION_ROWS (checked by tests/model/test_packed_layers.py)

Run = Callable[[list[Callable[[], None]]], None]
Shares = Callable[[int], list[tuple[int, int]]]
Then = Callable[[np.ndarray, int, int], None]


def pack(x: np.ndarray, blocks: int) -> np.ndarray:
    """``x`` float32 [M, K] (M <= 32 blocks) packed: [blocks, K, 32], zero rows after the last."""
    from kestrel_trio._kernels.x86.float32 import chunks as f32_chunks

    return f32_chunks.pack(np.ascontiguousarray(x, dtype=np.float32), blocks * LANES)  # [blocks, K, 32]


def unpack(packed: np.ndarray, rows: int) -> np.ndarray:
    """The first ``rows`` rows of ``packed`` [B, K, 32] as rows: a new array [rows, K]."""
    return np.ascontiguousarray(packed.transpose(0, 2, 1).reshape(-1, packed.shape[1])[:rows])  # [rows, K]


def product(packed: np.ndarray, w: np.ndarray, run: Run, shares: Shares, then: Then | None = None) -> np.ndarray:
    """``packed`` [B, K, 32] times ``w`` float32 [N, K] (unit column stride, K a multiple of 4), packed: [B, N, 32].

    The blocks are shared among ``run``'s threads (``shares(B)``), each multiplying its own by every weight row:
    f32_chunks.packed_product the rows in whole register blocks of 14, numpy the few past them. ``then(out,
    first, stop)``, if given, runs in the same task on the share's blocks [first, stop) of the product: what
    follows it token by token (a residual sum, a norm, SwiGLU) shared among the threads without a hand-off of
    its own, on blocks the task has just written.
    """
    return _product(packed, packed.shape[0], w, run, shares, then)


def product_of_rows(x: np.ndarray, blocks: int, w: np.ndarray, run: Run, shares: Shares,
                    then: Then | None = None) -> np.ndarray:
    """:func:`product` of rows ``x`` float32 [M, K] (C-contiguous, M <= 32 blocks), each thread packing its own
    blocks first (on one thread, a 256-token chunk's attention output took 0.43 ms to pack): [blocks, N, 32]."""
    return _product(x, blocks, w, run, shares, then)


def _product(source: np.ndarray, blocks: int, w: np.ndarray, run: Run, shares: Shares, then: Then | None) -> np.ndarray:
    """:func:`product` of ``source``: packed [blocks, K, 32], or rows [M, K] that each share packs for itself."""
    from kestrel_trio._kernels.x86.float32 import chunks as f32_chunks

    n = w.shape[0]
    blocked = n - n % f32_chunks.WEIGHT_ROWS
    out = np.empty((blocks, n, LANES), dtype=np.float32)  # [B, N, 32]

    def work(first: int, stop: int) -> None:
        if source.ndim == 2:  # rows: this share's, packed here
            packed = f32_chunks.pack(source[first * LANES : stop * LANES], (stop - first) * LANES)  # [blocks, K, 32]
        else:
            packed = source[first:stop]  # [blocks, K, 32]
        f32_chunks.packed_product(w, packed, out[first:stop], 0, stop - first)
        if blocked < n:
            out[first:stop, blocked:] = np.matmul(w[blocked:], packed)  # [blocks, N % 14, 32]
        if then is not None:
            then(out, first, stop)

    run_spans(work, blocks, run, shares)
    return out


def product_rows(packed: np.ndarray, w: np.ndarray, run: Run, shares: Shares) -> np.ndarray:
    """:func:`product` with its output in rows, [B * 32, N] (f32_chunks.product: the staging and gather)."""
    from kestrel_trio._kernels.x86.float32 import chunks as f32_chunks

    blocks, n = packed.shape[0], w.shape[0]
    blocked = n - n % f32_chunks.WEIGHT_ROWS
    out = np.empty((blocks * LANES, n), dtype=np.float32)  # [B * 32, N]

    def work(first: int, stop: int) -> None:
        f32_chunks.product(w, packed[first:stop], out[first * LANES :], 0, blocked)
        if blocked < n:
            part = np.matmul(w[blocked:], packed[first:stop])  # [blocks, N % 14, 32]
            out[first * LANES : stop * LANES, blocked:] = part.transpose(0, 2, 1).reshape(-1, n - blocked)

    run_spans(work, blocks, run, shares)
    return out


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray | None = None, first: int = 0,
             stop: int | None = None) -> np.ndarray:
    """Each token of ``x`` [B, D, 32] normed over D and scaled by ``weight`` float32 [D], into ``out`` (a new
    [B, D, 32] if None): its blocks [first, stop) (all if ``stop`` is None)."""
    from kestrel_trio._kernels.portable import norm

    out = np.empty(x.shape, dtype=np.float32) if out is None else out  # [B, D, 32]
    blocks = slice(first, x.shape[0] if stop is None else stop)
    norm.rms_norm_packed(x[blocks], weight, np.float32(eps), out[blocks])
    return out


def swiglu(gate_up: np.ndarray, out: np.ndarray, first: int, stop: int) -> None:
    """silu(gate) * up of the blocks [first, stop) of ``gate_up`` [B, 2 I, 32] (each block's gate rows, then its up
    rows) into ``out`` [B, I, 32] (kestrel_trio._kernels.portable.exp.swiglu: a block is a row of gate, then up)."""
    from kestrel_trio._kernels.portable import exp

    count = stop - first
    exp.swiglu(gate_up[first:stop].reshape(count, -1), out[first:stop].reshape(count, -1))
