"""Antialiased bicubic resize of uint8 frames, equal bit for bit to torch's x86 CPU kernel.

transformers' Qwen3-VL video processor resizes frames with torchvision, that is
``torch.nn.functional.interpolate(mode="bicubic", antialias=True)`` on uint8
tensors. On x86 (AVX2) torch runs Pillow-SIMD's integer algorithm
(aten/src/ATen/native/cpu/UpSampleKernel.cpp ``_compute_index_ranges_int16_weights``
and UpSampleKernelAVXAntialias.h ``ImagingResampleHorizontal`` / ``Vertical``):

1. per output pixel, Keys' cubic (a = -0.5) weights over the source pixels
   within ``2 * scale`` of its centre (``2`` when enlarging), normalised to sum 1;
2. the weights of one axis scaled to int16 with the most fractional bits that
   keep the largest weight below 2^15, rounded half away from zero;
3. a horizontal pass then a vertical pass (each only if that side changes),
   each summing ``pixel * weight`` from ``2^(bits - 1)`` (rounding), shifting
   right by ``bits`` and saturating to [0, 255].

Pillow's own resize differs from it by one level on some pixels (22 fractional
bits instead), which moves the model's logits by more than the 1e-4 the video
goldens allow; hence this module. Plain numpy, no Pillow needed.
"""

from __future__ import annotations

import numpy as np

__all__ = ["resize_bicubic_uint8"]


def _cubic(x: np.ndarray) -> np.ndarray:
    a = -0.5
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x < 1, near, np.where(x < 2, far, 0.0))


def _weights(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(first source index [out], int64 weights [out, taps], fractional bits) of one axis."""
    scale = in_size / out_size
    support = 2.0 * scale if scale >= 1.0 else 2.0  # bicubic reaches 2 pixels; widened when shrinking
    inv = 1.0 / scale if scale >= 1.0 else 1.0
    taps = int(np.ceil(support)) * 2 + 1
    starts = np.zeros(out_size, dtype=np.int64)
    weights = np.zeros((out_size, taps), dtype=np.float64)
    for i in range(out_size):
        center = scale * (i + 0.5)
        lo = max(int(center - support + 0.5), 0)  # int() truncates toward zero, as the C++ cast
        hi = min(int(center + support + 0.5), in_size)
        w = _cubic((np.arange(lo, hi) - center + 0.5) * inv)  # [hi - lo]
        total = w.sum()
        starts[i] = lo
        weights[i, : hi - lo] = w / total if total != 0 else w
    bits = 0
    top = weights.max()
    while bits < 22 and int(0.5 + top * (1 << (bits + 1))) < (1 << 15):
        bits += 1
    scaled = weights * (1 << bits)
    ints = np.where(scaled < 0, np.trunc(scaled - 0.5), np.trunc(scaled + 0.5)).astype(np.int64)  # [out, taps]
    return starts, ints, bits


def _pass(frame: np.ndarray, weights: tuple[np.ndarray, np.ndarray, int], axis: int) -> np.ndarray:
    """Resample one int32 frame [H, W, C] along ``axis`` (0 rows, 1 columns) with that axis's ``_weights``."""
    starts, ints, bits = weights
    out_size = starts.size
    src = np.moveaxis(frame, axis, 0)  # [in, other, C]
    padded = np.concatenate([src, np.zeros((ints.shape[1], *src.shape[1:]), dtype=src.dtype)])  # [in + taps, ...]
    # int32, as torch's own accumulators: 255 x the weights' absolute sum (about 1.2 x 2^bits, bits <= 22) < 2^31.
    acc = np.full((out_size, *src.shape[1:]), 1 << (bits - 1), dtype=np.int32)  # [out, other, C]
    for k in range(ints.shape[1]):
        acc += padded[starts + k] * ints[:, k, None, None].astype(np.int32)  # taps past a pixel's range weigh 0
    out = np.clip(acc >> bits, 0, 255)  # arithmetic shift, then saturate as packus does
    return np.moveaxis(out, 0, axis)


def resize_bicubic_uint8(frames: np.ndarray, height: int, width: int) -> np.ndarray:
    """Resize uint8 [n, H, W, C] frames to [n, height, width, C] as torch's antialiased bicubic does on x86.

    One frame at a time, so the int32 working copies stay one frame's size.
    """
    out = np.empty((frames.shape[0], height, width, frames.shape[3]), dtype=np.uint8)  # [n, height, width, C]
    columns = _weights(frames.shape[2], width) if width != frames.shape[2] else None
    rows = _weights(frames.shape[1], height) if height != frames.shape[1] else None
    for i, frame in enumerate(frames):
        values = frame.astype(np.int32)  # [H, W, C]
        if columns is not None:
            values = _pass(values, columns, axis=1)  # [H, width, C]
        if rows is not None:
            values = _pass(values, rows, axis=0)  # [height, width, C]
        out[i] = values
    return out
