"""How a KV cache stores its keys and values: float32, bf16 bits or float16; compute stays float32.

Theory of operation: a cache of ``dtype`` "bf16" or "fp16" keeps half the
bytes of "fp32". New keys and values are rounded once, when written (only the
T new rows of a step). Attention reads every cached row at every step, so the
read side is where the cost is: :func:`attend_stored` walks the cached tokens
in chunks small enough to stay in the core's L2 cache, widens each chunk into
a per-thread float32 scratch buffer that is allocated once, and runs the same
float32 products and softmax as the float32 path over it. Memory traffic
from RAM is halved; the widening costs one pass over the chunk, in cache.

bf16 is the top half of a float32, so widening bf16 is exact and needs no
arithmetic: the bits are copied into the odd uint16 halves of a scratch
buffer whose even (low) halves are zero and are never written. float16 is
widened by numpy's cast. Rounding to bf16 is to nearest even; float16 keeps
more mantissa (10 bits against 7) but only the range +-65504, so values
beyond are clipped to it when written (they would be inf otherwise).
"""

from __future__ import annotations

import sys
import threading

import numpy as np

from kestrel_trio import _kernels
from kestrel_trio._model.checkpoints.safetensors import fp32_to_bf16_bits

__all__ = ["KV_DTYPES", "storage_dtype", "to_storage", "attend_stored", "mask_future", "softmax_numerators"]

KV_DTYPES = ("fp32", "bf16", "fp16")
_STORAGE = {"fp32": np.dtype(np.float32), "bf16": np.dtype(np.uint16), "fp16": np.dtype(np.float16)}
_FP16_MAX = np.float32(65504.0)

# float32 elements widened at once: 64 Ki (256 KiB), a quarter of this machine's L2, so the chunk and its
# scores stay in cache between the widening and the product.
CHUNK_ELEMENTS = 1 << 16
_scratch = threading.local()  # one buffer per thread: prefill attention shares heads among threads
# The bf16 widening writes a float32's high half as uint16 index 1 of its pair: the little-endian layout.
assert sys.byteorder == "little", "bf16 KV storage assumes a little-endian machine"


def storage_dtype(name: str) -> np.dtype:
    """The numpy dtype that holds a KV cache of ``name`` ("fp32", "bf16" as uint16 bits, "fp16")."""
    try:
        return _STORAGE[name]
    except KeyError:
        raise ValueError(f"the KV cache dtype must be one of {', '.join(KV_DTYPES)}, got {name!r}") from None


def to_storage(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """float32 ``x`` rounded to the storage ``dtype`` (a new array of the same shape)."""
    if dtype == np.float32:
        return x
    if dtype == np.uint16:
        return fp32_to_bf16_bits(x).reshape(x.shape)  # [...] bf16 bits, nearest even
    return np.clip(x, -_FP16_MAX, _FP16_MAX).astype(np.float16)  # [...]


def mask_future(scores: np.ndarray, diagonal: np.ndarray | None) -> None:
    """Add the causal mask of B queries over their own keys to ``scores`` [h, B*group, seen], in place.

    Rows are in (query, group) order; the last B keys are the queries' own,
    ``diagonal`` [B, B] is 0 or -inf (key after query). None: one query, nothing hidden.
    """
    if diagonal is None:
        return
    h, rows, seen = scores.shape
    b = diagonal.shape[0]
    own = scores.reshape(h, b, rows // b, seen)[..., seen - b :]  # [h, B, group, B]
    np.add(own, diagonal[None, :, None, :], out=own)


def softmax_numerators(scores: np.ndarray) -> np.ndarray:
    """``scores`` [h, rows, seen] to e^(s - its row's max) in place; the row sums [h, rows, 1].

    In one compiled pass where numba runs (kestrel_trio._kernels.softmax_numerators), else in numpy.
    A speculative verify step's rows and a one-token step's may then differ in the last bits (their sums
    run in another order): tests/server/test_speculative_server.py holds the served logprobs to 1e-4 and
    the tokens exact.
    """
    sums = _kernels.softmax_numerators(scores)  # [h, rows, 1]
    if sums is None:
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        sums = scores.sum(axis=-1, keepdims=True)  # [h, rows, 1]
    return sums


def attend_stored(grouped: np.ndarray, keys: np.ndarray, values: np.ndarray, diagonal: np.ndarray | None,
                  out: np.ndarray) -> None:
    """Softmax attention of float32 ``grouped`` [h, rows, head_dim] over stored ``keys``, ``values`` [h, total, head_dim].

    Same arithmetic as the float32 path (scores, max-shifted exp, weighted sum,
    one division), over keys and values widened chunk by chunk.

    Args:
        grouped: scaled queries, [h, B*group, head_dim], rows in (query, group) order.
        keys: bf16 bits (uint16) or float16, [h, total, head_dim], the last B the queries' own.
        values: as ``keys``.
        diagonal: [B, B] 0 or -inf, the queries' mask over their own keys (:func:`mask_future`), or None.
        out: float32 [h, B*group, head_dim], written.
    """
    h, rows, head_dim = grouped.shape
    total = keys.shape[1]
    step = max(16, CHUNK_ELEMENTS // (h * head_dim))  # tokens per chunk
    widened = _widening_buffer(h * min(step, total) * head_dim, keys.dtype)
    scores = np.empty((h, rows, total), dtype=np.float32)  # [h, B*group, total]
    for start in range(0, total, step):
        stop = min(start + step, total)
        chunk = _widen(keys[:, start:stop], widened)  # [h, c, head_dim]
        np.matmul(grouped, chunk.transpose(0, 2, 1), out=scores[:, :, start:stop])  # [h, B*group, c]
    mask_future(scores, diagonal)
    sums = softmax_numerators(scores)  # [h, B*group, 1]
    partial = None
    for start in range(0, total, step):
        stop = min(start + step, total)
        chunk = _widen(values[:, start:stop], widened)  # [h, c, head_dim]
        if partial is None:
            np.matmul(scores[:, :, start:stop], chunk, out=out)  # [h, B*group, head_dim]
            partial = np.empty_like(out)  # [h, B*group, head_dim]
        else:
            np.matmul(scores[:, :, start:stop], chunk, out=partial)
            out += partial
    out /= sums


def _widen(stored: np.ndarray, buffer: np.ndarray) -> np.ndarray:
    """float32 values of ``stored`` [h, c, head_dim], written into the front of the thread's ``buffer``."""
    h, c, d = stored.shape
    target = buffer[: h * c * d].reshape(h, c, d)  # [h, c, head_dim]
    if stored.dtype == np.uint16:
        target.view(np.uint16)[..., 1::2] = stored  # the high halves; the low halves stay zero
    else:
        np.copyto(target, stored)
    return target


def _widening_buffer(size: int, stored: np.dtype) -> np.ndarray:
    """This thread's float32 scratch for widening ``stored``, at least ``size`` elements, grown never shrunk.

    The bf16 one is only ever written in its high halves, so its low halves stay the zeros it was made with.
    """
    name = "bf16" if stored == np.uint16 else "fp16"
    buffer = getattr(_scratch, name, None)
    if buffer is None or buffer.size < size:
        buffer = np.zeros(size, dtype=np.float32)  # [size]
        setattr(_scratch, name, buffer)
    return buffer
