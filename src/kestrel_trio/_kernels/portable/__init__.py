"""The portable loops (numba): the reference every architecture's kernel is tested against, and
what runs where a CPU has no kernel of its own; the compiled hand-off between product threads.

``forms`` (a room of its own, below this one) is one home per storage form of
weights (its block constants, exact row expander and one-pass loops) and the
dot loops they share. ``products`` is generated from ``template`` over those
homes by ``generate`` (``python -m kestrel_trio._kernels.portable.generate``):
one cached product and expansion per form, which refuses to load when a home
changed since it was generated (``stamp``: numba checks a cached function's own
file only). ``signatures`` are their numba types; ``integer`` the integer
products' reference; ``handoff`` and ``spans`` the product threads' compiled
hand-off; ``exp``, ``norm``, ``rope`` and ``chunk_qkv`` the layers' loops.
"""
