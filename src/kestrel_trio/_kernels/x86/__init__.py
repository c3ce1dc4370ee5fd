"""x86-64 kernels: what differs on an x86-64 CPU from the portable loops (``_kernels.portable``).

Each kernel here has a portable reference it is tested against, bit for bit; the
dispatch (``_kernels.dispatch``) picks these only on x86-64, and only where the
code numba compiles for has the instructions (:func:`integer.usable_kernel`).

The integer block products (``integer``: AVX2, AVX-VNNI, AVX512-VNNI) and AMX's bf16 tiles
(``tiles``) are here; the kernels over float32 activations written in inline assembly are
in ``float32``.
"""
