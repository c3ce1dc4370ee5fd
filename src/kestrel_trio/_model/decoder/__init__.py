"""The model itself: the layers, rotary positions, the chunked attention and the forward passes
(forward: any batch; decode_step: one token per sequence; packed_layers: over packed rows).

A room of kestrel_trio._model: its ranks among the others are in tests/test_architecture.py.
"""
