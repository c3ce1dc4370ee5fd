"""aarch64 kernels: what differs on the board's CPU from the portable loops (``_kernels.portable``).

Each kernel here has a portable reference it is tested against, bit for bit; the
dispatch (``_kernels.dispatch``) picks these only on aarch64.
"""
