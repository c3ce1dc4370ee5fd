"""Attention's softmax numerators in AVX-512 assembly: _kernels.portable.exp's exponential, 16 lanes at a time.

Theory of operation: numba compiles kestrel_trio._kernels.portable.exp's loops for
256-bit vectors on Intel's AVX-512 CPUs (LLVM's tuning prefers them
there), and a prefill's attention spent a fifth of its time on the softmax.
Here the same exponential (:func:`_exp_lines`: Cody-Waite reduction to
r = x - n ln 2, exp.py's degree-5 polynomial for e^r) runs on zmm vectors,
n put into the exponent by ``vscalefps`` (which gives inf past e^88.7
itself), and 0 below exp.py's lowest x, as there.

:func:`softmax_rows` takes a register block's rows of attention scores
(kestrel_trio._kernels.x86.float32.attention), each to e^(s - its max) over its
first ``count`` scores and 0 after them up to a width, and the numerators'
sum: a pass for the maximum, one for the exponentials (a masked vector for
the last part-vector), one for the zeros. Measured on the 2-core Xeon with
AMX, one thread: rows of 500 scores in L1, 0.29 ns an element
against 0.59 for exp.py's loops (both called from compiled code), the
numerators equal to theirs; the chunk attention of Qwen3-0.6B's heads, 256
queries after 256 keys 6.13 ms against 7.10, 256 after none 2.57 against
3.15 (medians of 9).

SwiGLU's exponentials stay in exp.py: with its division per element the same
code here was 0.37 ns an element against 0.47, not worth a second kernel.

Only where the plan's softmax is "avx512" (kestrel_trio._kernels.plan: the AVX-512 assembly, f32_assembly()
"avx512"); elsewhere exp.py's loops run. The sums are in another order than
exp.py's (16 lanes, then the lanes added pairwise): equal within float32
rounding.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from kestrel_trio._kernels.portable import exp
from kestrel_trio._kernels.x86.float32.assembly import _asm_codegen

__all__ = ["softmax_rows", "OPERANDS"]

OPERANDS = 6  # the int64 operands of each kernel (their texts say which is which)


def _bits(value: np.float32) -> int:
    """The bit pattern of float32 ``value``, as an unsigned int (an immediate)."""
    return int(np.float32(value).view(np.uint32))


# The exponential's constants, each broadcast once into a zmm register that no other line writes.
_CONSTANTS = {
    "%zmm16": exp._LOG2E, "%zmm17": np.float32(0.5), "%zmm18": exp._LN2_HI, "%zmm19": exp._LN2_LO,
    "%zmm20": exp._P0, "%zmm21": exp._P1, "%zmm22": exp._P2, "%zmm23": exp._P3, "%zmm24": exp._P4,
    "%zmm25": exp._P5, "%zmm26": np.float32(1.0), "%zmm27": exp._LOWEST, "%zmm28": np.float32(-87.5),
    "%zmm30": np.float32(88.5),
}
_ZERO = "%zmm29"
_VECTORS = [f"zmm{i}" for i in range(31)]


def _constant_lines() -> list[str]:
    lines = [f"vpxord {_ZERO}, {_ZERO}, {_ZERO}"]
    for register, value in _CONSTANTS.items():
        lines += [f"mov $${_bits(value)}, %eax", f"vpbroadcastd %eax, {register}"]
    return lines


def _exp_lines(x: str, out: str, n: str, r: str) -> list[str]:
    """``out`` = e^``x`` (zmm registers; ``n`` and ``r`` scratch; ``x`` kept), as exp._exp computes it.

    n = floor(min(max(x, -87.5), 88.5) log2 e + 1/2) (NaN clamps to -87.5: ``vmaxps`` gives its second source
    for a NaN); r from x itself, so that a NaN stays one; y = e^r by the polynomial; y 2^n by ``vscalefps`` (inf
    where that overflows); 0 where x is below exp._LOWEST (k2 is scratch).
    """
    return [f"vmaxps %zmm28, {x}, {n}", f"vminps %zmm30, {n}, {n}", f"vfmadd132ps %zmm16, %zmm17, {n}",
            f"vrndscaleps $$9, {n}, {n}", f"vmovaps {x}, {r}", f"vfnmadd231ps %zmm18, {n}, {r}",
            f"vfnmadd231ps %zmm19, {n}, {r}",
            f"vmovaps %zmm20, {out}", f"vfmadd213ps %zmm21, {r}, {out}", f"vfmadd213ps %zmm22, {r}, {out}",
            f"vfmadd213ps %zmm23, {r}, {out}", f"vfmadd213ps %zmm24, {r}, {out}", f"vfmadd213ps %zmm25, {r}, {out}",
            f"vmulps {r}, {out}, {out}", f"vfmadd213ps {r}, {r}, {out}", f"vaddps %zmm26, {out}, {out}",
            f"vscalefps {n}, {out}, {out}", f"vcmpps $$1, %zmm27, {x}, %k2", f"vmovaps {_ZERO}, {out} {{%k2}}"]


def _folded(op: str, v: int, scratch: int) -> list[str]:
    """zmm ``v``'s 16 lanes folded by ``op`` ("vmaxps", "vaddps") into its lane 0: halves, then quarters, down to
    one (``scratch`` a zmm register number)."""
    lines = [f"vextractf64x4 $$1, %zmm{v}, %ymm{scratch}", f"{op} %ymm{scratch}, %ymm{v}, %ymm{v}",
             f"vextractf128 $$1, %ymm{v}, %xmm{scratch}", f"{op} %xmm{scratch}, %xmm{v}, %xmm{v}"]
    for swap in (78, 177):  # the two 64-bit halves, then neighbouring lanes
        lines += [f"vpermilps $${swap}, %xmm{v}, %xmm{scratch}", f"{op} %xmm{scratch}, %xmm{v}, %xmm{v}"]
    return lines


def _softmax_text() -> str:
    """Rows of scores to their softmax numerators, in place. Operands at $0, int64 [OPERANDS]: 0 the first row;
    1 the rows' stride (bytes); 2 the rows; 3 each row's count, int64 [rows] (>= 1); 4 the width (floats, a
    multiple of 16, >= every count); 5 the sums, float32 [rows] (written)."""
    lines = _constant_lines() + ["mov 0($0), %r8", "mov 24($0), %r9", "mov 40($0), %r10", "mov 16($0), %r11",
                                 "4:", "mov (%r9), %rcx", "mov %rcx, %rdx", "and $$15, %ecx", "mov $$1, %eax",
                                 "shl %cl, %eax", "dec %eax", "kmovw %eax, %k1", "shr $$4, %rdx", "mov %r8, %rsi"]
    # The maximum: whole vectors, then the part-vector's lanes (k1), each lane's largest folded into lane 0.
    lines += ["vbroadcastss (%r8), %zmm0", "mov %rdx, %rdi", "test %rdi, %rdi", "jz 2f",
              "1:", "vmaxps (%rsi), %zmm0, %zmm0", "add $$64, %rsi", "dec %rdi", "jnz 1b",
              "2:", "vmaxps (%rsi), %zmm0, %zmm0 {%k1}"] + _folded("vmaxps", 0, 1) + ["vbroadcastss %xmm0, %zmm0"]
    # The numerators: whole vectors, then the part-vector (its lanes past the count 0), then zeros to the width.
    lines += ["vpxord %zmm5, %zmm5, %zmm5", "mov %r8, %rsi", "mov %rdx, %rdi", "test %rdi, %rdi", "jz 2f",
              "1:", "vmovups (%rsi), %zmm1", "vsubps %zmm0, %zmm1, %zmm1"]
    lines += _exp_lines("%zmm1", "%zmm2", "%zmm3", "%zmm4")
    lines += ["vmovups %zmm2, (%rsi)", "vaddps %zmm2, %zmm5, %zmm5", "add $$64, %rsi", "dec %rdi", "jnz 1b",
              "2:", "kortestw %k1, %k1", "jz 3f", "vmovups (%rsi), %zmm1 {%k1} {z}", "vsubps %zmm0, %zmm1, %zmm1"]
    lines += _exp_lines("%zmm1", "%zmm2", "%zmm3", "%zmm4")
    lines += ["vmovaps %zmm2, %zmm2 {%k1} {z}", "vmovups %zmm2, (%rsi)", "vaddps %zmm2, %zmm5, %zmm5", "add $$64, %rsi",
              "3:", "mov 32($0), %rdi", "lea (%r8,%rdi,4), %rdi", "5:", "cmp %rdi, %rsi", "jae 6f",
              f"vmovups {_ZERO}, (%rsi)", "add $$64, %rsi", "jmp 5b", "6:"]
    # The sum of the numerators' 16 lanes into sums[row].
    lines += _folded("vaddps", 5, 1) + ["vmovss %xmm5, (%r10)"]
    lines += ["add 8($0), %r8", "add $$8, %r9", "add $$4, %r10", "dec %r11", "jnz 4b", "vzeroupper"]  # the next row
    return "\n".join(lines)


_CLOBBERED = _VECTORS + ["k1", "k2"]


@intrinsic
def _softmax(typingctx, operands):
    """:func:`_softmax_text`; ``operands``: the address of its int64 [OPERANDS] operands."""
    return types.void(types.int64), _asm_codegen(_softmax_text(), _CLOBBERED)


@njit(nogil=True, cache=True)
def softmax_rows(scores, counts, width, sums, operands):
    """``scores[r, :counts[r]]`` to e^(s - their max) and ``scores[r, counts[r]:width]`` to 0, in place, for every
    row r of ``scores`` float32 [R, >= width] (unit column stride); the numerators' sums into ``sums`` float32 [R].

    ``counts`` int64 [R], each at least 1 and at most ``width``, a multiple of 16; ``operands`` int64 [OPERANDS]
    scratch. A row holding NaN gets NaN numerators (its maximum is then whatever ``vmaxps`` makes of it).
    """
    operands[0], operands[1], operands[2] = scores.ctypes.data, scores.strides[0], scores.shape[0]
    operands[3], operands[4], operands[5] = counts.ctypes.data, width, sums.ctypes.data
    _softmax(operands.ctypes.data)

