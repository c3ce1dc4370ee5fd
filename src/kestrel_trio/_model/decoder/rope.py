"""Rotary position embeddings: default, linear, llama3 and yarn, as transformers applies them.

Qwen and Llama (as transformers holds them) rotate the two halves of each
head (``rotate_half``), not interleaved pairs; a GGUF's llama q/k rows, which
llama.cpp's converter interleaves, are put back at load
(kestrel_trio._model.gguf.names). Frequencies are computed in float32 the way
the reference does, so the angles round identically.
"""

from __future__ import annotations

import math

import attrs
import numpy as np

from kestrel_trio import _kernels
from kestrel_trio._model.checkpoints.config import RopeConfig

__all__ = ["Rope"]


@attrs.frozen
class Rope:
    """Inverse frequencies and cos/sin scale for one head size.

    Attributes:
        inv_freq: float32 [head_dim/2] radians per position.
        attention_scaling: the factor yarn applies to cos and sin (1.0 otherwise).
    """

    inv_freq: np.ndarray  # [head_dim/2]
    attention_scaling: float

    @classmethod
    def build(cls, rope: RopeConfig, head_dim: int) -> "Rope":
        """Frequencies for ``rope`` over ``head_dim`` (even) channels."""
        exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)  # [head_dim/2]
        pos_freqs = np.float32(rope.rope_theta) ** exponents  # [head_dim/2]
        inv_freq = (np.float32(1.0) / pos_freqs).astype(np.float32)  # [head_dim/2]
        if rope.freq_factors is not None:
            inv_freq = inv_freq / np.asarray(rope.freq_factors, dtype=np.float32)  # [head_dim/2]
        if rope.rope_type == "linear":
            inv_freq = inv_freq / np.float32(rope.factor)  # [head_dim/2]
        elif rope.rope_type == "llama3":
            inv_freq = _llama3(rope, inv_freq)  # [head_dim/2]
        elif rope.rope_type == "yarn":
            return _yarn(rope, head_dim, pos_freqs)
        return cls(inv_freq=inv_freq, attention_scaling=1.0)

    def cos_sin(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos and sin for integer ``positions`` [T], each float32 [T, head_dim/2], scaled."""
        angles = positions.astype(np.float32)[:, None] * self.inv_freq[None, :]  # [T, head_dim/2]
        cos = np.cos(angles)  # [T, head_dim/2]
        sin = np.sin(angles)  # [T, head_dim/2]
        if self.attention_scaling != 1.0:
            cos *= np.float32(self.attention_scaling)
            sin *= np.float32(self.attention_scaling)
        return cos, sin


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate ``x`` [T, heads, head_dim] by per-position angles (cos, sin [T, head_dim/2]).

    In one compiled pass where numba runs (kestrel_trio._kernels.rotate_half, the same values bit for bit),
    else in numpy.
    """
    if x.dtype == cos.dtype == sin.dtype == np.float32 and cos.ndim == 2:
        rotated = _kernels.rotate_half(x, cos, sin)  # [T, heads, head_dim]
        if rotated is not None:
            return rotated
    return _apply_rope_numpy(x, cos, sin)


def _apply_rope_numpy(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    x1 = x[..., :half]  # [T, heads, head_dim/2]
    x2 = x[..., half:]  # [T, heads, head_dim/2]
    c = cos[:, None, :]  # [T, 1, head_dim/2]
    s = sin[:, None, :]  # [T, 1, head_dim/2]
    out = np.empty_like(x)  # [T, heads, head_dim]
    first, second = out[..., :half], out[..., half:]  # [T, heads, head_dim/2] views
    np.multiply(x1, c, out=first)  # written in place: the same values as x1 * c - x2 * s, 3x faster
    first -= x2 * s
    np.multiply(x2, c, out=second)
    second += x1 * s
    return out


def _llama3(rope: RopeConfig, inv_freq: np.ndarray) -> np.ndarray:
    """Llama 3.1's scaling of ``inv_freq`` [head_dim/2]: long wavelengths slowed by ``factor``, short ones
    kept, the band between interpolated; float32 in the reference's order of operations."""
    factor = np.float32(rope.factor)
    low, high = np.float32(rope.low_freq_factor), np.float32(rope.high_freq_factor)
    original = np.float32(rope.original_max_position_embeddings)
    low_freq_wavelen, high_freq_wavelen = original / low, original / high
    wavelen = np.float32(2 * math.pi) / inv_freq  # [head_dim/2]
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)  # [head_dim/2]
    smooth = (original / wavelen - low) / (high - low)  # [head_dim/2]
    smoothed = (np.float32(1) - smooth) * scaled / factor + smooth * scaled  # [head_dim/2]
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)  # [head_dim/2]
    return np.where(medium, smoothed, scaled).astype(np.float32)  # [head_dim/2]


def _yarn(rope: RopeConfig, head_dim: int, pos_freqs: np.ndarray) -> Rope:
    factor = float(rope.factor)  # type: ignore[arg-type]
    original = int(rope.original_max_position_embeddings)  # type: ignore[arg-type]

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if rope.attention_factor is not None:
        attention = rope.attention_factor
    elif rope.mscale and rope.mscale_all_dim:
        attention = mscale(factor, rope.mscale) / mscale(factor, rope.mscale_all_dim)
    else:
        attention = mscale(factor)

    def correction_dim(rotations: float) -> float:
        return (head_dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(rope.rope_theta))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # the reference's guard against a zero-width ramp
    ramp = np.clip((np.arange(head_dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)  # [head_dim/2]
    extrapolation_weight = (np.float32(1) - ramp).astype(np.float32)  # [head_dim/2]
    inv_extrapolation = np.float32(1.0) / pos_freqs  # [head_dim/2]
    inv_interpolation = np.float32(1.0) / (np.float32(factor) * pos_freqs)  # [head_dim/2]
    inv_freq = inv_interpolation * (1 - extrapolation_weight) + inv_extrapolation * extrapolation_weight  # [head_dim/2]
    return Rope(inv_freq=inv_freq.astype(np.float32), attention_scaling=float(attention))
