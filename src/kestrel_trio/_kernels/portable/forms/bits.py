"""Stored bits read as numbers, for every form's expanders and one-pass loops: the float16 table, a block's
little-endian float16 and uint32, a register's bits as a float32."""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

__all__ = ["f16_table"]

# The expanders' compilation: no fastmath, so that no contracted multiply-add rounds differently from
# numpy's (kestrel_trio._kernels.portable.forms says why).
_EXACT = dict(nogil=True, fastmath=False)


def f16_table() -> np.ndarray:
    """Every float16 bit pattern's float32 value: float32 [65536], the same bits on every architecture.

    Made from the bits, not by numpy's float16 cast: on aarch64 that cast is the CPU's ``fcvt``, which
    quiets a signalling NaN and raises the invalid flag (numpy warns), while x86-64's keeps the payload. Here
    every NaN keeps its payload and sign, as x86-64's cast gives, and no floating-point flag is raised.
    """
    bits = np.arange(1 << 16, dtype=np.uint32)  # [65536]
    exponent = (bits >> 10) & 0x1F
    mantissa = bits & 0x3FF
    # Finite values: mantissa * 2^-24 (subnormal, exponent 0) or (1024 + mantissa) * 2^(exponent - 25), exact.
    significand = (mantissa | np.where(exponent > 0, 0x400, 0)).astype(np.float32)  # [65536]
    magnitude = np.ldexp(significand, np.maximum(exponent, 1).astype(np.int32) - 25).view(np.uint32)  # [65536]
    infinite_or_nan = np.uint32(0x7F800000) | (mantissa << 13)  # [65536]
    value = np.where(exponent == 0x1F, infinite_or_nan, magnitude) | ((bits & 0x8000) << 16)  # [65536]
    return value.astype(np.uint32).view(np.float32)


@njit(**_EXACT)
def _half(row, at, f16):
    """The little-endian float16 at byte ``at``, as float32."""
    return f16[np.int32(row[at]) | (np.int32(row[at + 1]) << 8)]


@njit(**_EXACT)
def _word(row, at):
    """The little-endian uint32 at byte ``at``, as int64."""
    return (np.int64(row[at]) | (np.int64(row[at + 1]) << 8) | (np.int64(row[at + 2]) << 16)
            | (np.int64(row[at + 3]) << 24))


@intrinsic
def _bits_as_float32(typingctx, bits):
    """The float32 whose bits are ``bits`` (uint32): a register reinterpreted, no conversion."""
    def codegen(context, builder, signature, args):
        from llvmlite import ir

        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.uint32), codegen
