"""The portable loops (numba): the reference every architecture's kernel is tested against, and
what runs where a CPU has no kernel of its own; the compiled hand-off between product threads.

``forms`` (a room of its own, below this one) holds everything per storage
form of weights: one home per form (its block constants, exact row expander and
one-pass loops), the dot loops they share, and the template ``products`` is
generated from (``python -m kestrel_trio._kernels.portable.forms.generate``).
``products`` holds one cached product and expansion per form, and refuses to
load when a file in ``forms`` changed since it was generated (numba checks a
cached function's own file only). ``signatures`` are their numba types;
``integer`` the integer products' reference; ``handoff`` and ``spans`` the
product threads' compiled hand-off; ``exp``, ``norm``, ``rope`` and
``chunk_qkv`` the layers' loops.
"""
