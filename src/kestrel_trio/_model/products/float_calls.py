"""The ways one thread multiplies activations by a float32 weight: the SMALL_BATCH_CALLS.

``x`` [N, in] @ ``W`` [out, in].T into ``out`` [N, out], in this thread, as
the caller chose (kestrel_trio._model.products.matmul chooses, and shares a
product's stretches of W's rows among the product threads, each running
one of these): one BLAS call either way round, one small GEMM per block of
W's rows (:func:`block_rows`), or kestrel_trio._kernels' float32 product.
"""

from __future__ import annotations

import numpy as np

from kestrel_trio import _kernels

__all__ = ["SMALL_BATCH_CALLS", "product_into", "block_rows", "row_blocks_into"]

# The calls a 2-32-row product may take, each timed once per model (matmul.small_batch_call).
SMALL_BATCH_CALLS = ("weight_left", "weight_right", "row_blocks", "compiled")


def product_into(x: np.ndarray, weight: np.ndarray, out: np.ndarray, call: str) -> None:
    """``out`` [N, out] = ``x`` [N, in] @ ``weight`` [out, in].T in this thread, in ``call`` (one of
    SMALL_BATCH_CALLS; chosen by the caller, since a product thread does not see the running model's backend)."""
    if call == "row_blocks":
        row_blocks_into(x, weight, out)
    elif call == "compiled":
        _kernels.packed_product("F32", weight, None, np.ascontiguousarray(x), 0, weight.shape[0], out)
    elif call == "weight_left":
        out[...] = (weight @ x.T).T  # [N, out]
    else:
        np.matmul(x, weight.T, out=out)  # [N, out]


def block_rows(rows: int) -> int:
    """Weight rows per block of the "row_blocks" call for ``rows`` activation rows.

    OpenBLAS's SkylakeX kernels skip packing for products of up to about
    256 x ``in`` x rows multiply-adds. 16 or 32 weight rows per block
    measured fastest for 2-32 rows. The products of a Qwen3-0.6B step, 2
    threads, quiet machine, in ms, SkylakeX / Haswell, for blocks of 16, 32,
    64 and 128 rows:
    - 2 rows: 104/152, 102/151, 102/178, 101/193;
    - 4 rows: 108/168, 107/164, 108/186, 133/203;
    - 8 rows, Haswell only: 185, 171, 191, 206;
    - 16 rows: 186/261, 205/235, 247/248, 242/257.
    Haswell, which packs every block, wants them no larger than 32.
    """
    return max(16, min(32, 1 << max(0, (256 // rows).bit_length() - 1)))


def row_blocks_into(x: np.ndarray, weight: np.ndarray, out: np.ndarray) -> None:
    """``out`` [N, out] = ``x`` [N, in] @ ``weight`` [out, in].T, one small GEMM per block_rows(N) rows of W."""
    rows, width = x.shape
    nb = block_rows(rows)
    whole = weight.shape[0] // nb * nb
    if whole:
        blocks = np.matmul(weight[:whole].reshape(-1, nb, width), x.T)  # [whole/nb, nb, N]
        out[:, :whole] = blocks.reshape(whole, rows).T  # [N, whole]
    if whole < weight.shape[0]:
        out[:, whole:] = x @ weight[whole:].T  # [N, out - whole]

