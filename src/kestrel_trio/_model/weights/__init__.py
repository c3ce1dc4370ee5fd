"""A checkpoint's tensors assembled into a decoder's weights (assemble), in the residency asked for
(residency, quantize and its on-disk cache, GGUF's own blocks), and which bytes stay mapped.

A room of kestrel_trio._model: its ranks among the others are in tests/test_architecture.py.
"""
