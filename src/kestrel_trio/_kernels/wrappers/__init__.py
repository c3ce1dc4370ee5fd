"""The calls the model makes: each wrapper takes arrays as a forward pass holds them, checks them, and runs
the compiled loop the plan chose on them (or returns None where it cannot, and the caller keeps its numpy
path): the layers' loops (layers), the products of packed weights (packed) and the x86-64 prefill kernels
(prefill); and what runs here, in words (report: the start-up line, /health). Re-exported by
kestrel_trio._kernels, where kestrel_trio._model calls them.
"""
