"""The portable loops (numba): the reference every architecture's kernel is tested against, and
what runs where a CPU has no kernel of its own; the compiled hand-off between product threads.
"""
