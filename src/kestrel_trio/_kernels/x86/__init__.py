"""x86-64 kernels: what differs on an x86-64 CPU from the portable loops beside them (``_kernels``).

Each kernel here has a portable reference it is tested against, bit for bit; the
dispatch (``_kernels.products``) picks these only on x86-64, and only where the
code numba compiles for has the instructions (:func:`integer.usable_kernel`).
"""
