"""The weight products y = x W^T over every storage form, on kestrel's product threads or BLAS's,
and the choice between them (share_choice). matmul decides which way each product runs; float_calls
holds the float32 calls one thread makes, packed_chunks a packed matrix expanded chunk by chunk for BLAS.

A room of kestrel_trio._model: its ranks among the others are in tests/test_architecture.py.
"""
