"""Inline x86-64 assembly as a numba intrinsic's body: the code generator every assembly kernel here shares.

Each kernel (kestrel_trio._kernels.x86.float32.blocks, .f32_chunks, .f32_exp,
.f32_attention) passes one int64 operand, the address of its operand array,
and names the vector registers it overwrites; the general registers the
kernels use, memory and the flags are clobbered for all of them.
"""

from __future__ import annotations

__all__ = ["_asm_codegen", "_ZMM"]


def _asm_codegen(text: str, vectors: list[str]):
    def codegen(context, builder, signature, args):
        from llvmlite import ir

        clobbers = ",".join([f"~{{{r}}}" for r in ("r8", "r9", "r10", "r11", "r12", "r13", "r14", "rdx", "rcx", "rax",
                                                   "rsi", "rdi")]
                            + [f"~{{{v}}}" for v in vectors]
                            + ["~{memory}", "~{cc}", "~{dirflag}", "~{fpsr}", "~{flags}"])
        asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [ir.IntType(64)]), text, "r," + clobbers, side_effect=True)
        builder.call(asm, list(args))
        return context.get_dummy_value()
    return codegen


_ZMM = [f"zmm{i}" for i in range(31)]
