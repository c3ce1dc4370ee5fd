"""numba's code for an aarch64 kernel, compiled to aarch64 assembly on any host: which instructions it holds.

``python tests/aarch64_assembly.py KERNEL CPU`` prints a JSON object {mnemonic: count} of the assembly of
``kestrel_trio._kernels.arm.integer.KERNEL`` (``product_sdot``, ``product_widening``) for aarch64 ``CPU``
(e.g. cortex-a76, cortex-a53).

numba lowers the kernel to LLVM IR on this host as it would anywhere (its intrinsics emit the same vector IR on
every host); the module is taken from numba just before its last optimization, which would run for this host's
target, and LLVM's AArch64 back end (llvmlite's) optimizes it at -O3 for ``CPU`` and emits the assembly. numba
never makes machine code of it here: an x86-64 host could not select ``sdot``, so this runs in a process of its
own, which the module's state (numba's patched library) cannot outlive. The kernel is compiled without numba's
reference counting (it allocates nothing), whose x86-64 decrement would otherwise be an x86 intrinsic by then.
On an aarch64 host the lane's own test (test_integer_products: numba's native assembly) checks the same.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter

import numba
import numpy as np
from llvmlite import binding as ll
from numba.core import codegen

from kestrel_trio._kernels.arm import integer as arm

TRIPLE = "aarch64-unknown-linux-gnu"


class _Taken(Exception):
    """Raised once the kernel's module is in hand: numba's compilation stops there."""


def kernel_ir(name: str) -> str:
    """The LLVM IR of ``arm.<name>`` as numba links it, before its final (host-targeted) optimization."""
    taken: list[str] = []
    optimize = codegen.JITCodeLibrary._optimize_final_module

    def take(library) -> None:
        text = str(library._final_module)
        if f"{name}B" in text and "define" in text:  # the kernel's own module (its mangled name), not a helper's
            taken.append(text)
            raise _Taken
        optimize(library)

    codegen.JITCodeLibrary._optimize_final_module = take
    fresh = numba.njit(nogil=True, _nrt=False)(getattr(arm, name).py_func)  # afresh: a cached one has no IR
    data = np.zeros((5, 68), dtype=np.uint8)  # [rows, two Q8_0 blocks]
    xq, xd = np.zeros((1, 64), dtype=np.int8), np.ones((1, 2), dtype=np.float32)  # [1, cols], [1, blocks]
    try:
        fresh(0, data, xq, xd, xd, 0, 5, np.empty((1, 5), dtype=np.float32))
    except _Taken:
        return taken[-1]
    raise RuntimeError(f"numba compiled {name} without handing over its module")


def assembly(ir_text: str, cpu: str) -> str:
    """``ir_text`` optimized at -O3 and emitted as aarch64 assembly for ``cpu`` (its own features only)."""
    ll.initialize_all_targets()
    ll.initialize_all_asmprinters()
    machine = ll.Target.from_triple(TRIPLE).create_target_machine(cpu=cpu, features="", opt=3)
    module = ll.parse_assembly(ir_text)
    module.triple, module.data_layout = TRIPLE, str(machine.target_data)
    builder = ll.create_pass_builder(machine, ll.create_pipeline_tuning_options(speed_level=3))
    builder.getModulePassManager().run(module, builder)
    return machine.emit_assembly(module)


def mnemonics(text: str) -> Counter:
    """How many times each instruction occurs in assembly ``text`` (directives and labels left out)."""
    return Counter(m.group(1) for m in re.finditer(r"^\s+([a-z][a-z0-9.]*)\s", text, re.MULTILINE))


if __name__ == "__main__":
    print(json.dumps(dict(mnemonics(assembly(kernel_ir(sys.argv[1]), sys.argv[2])))))
