"""The weight products y = x W^T over every storage form, on kestrel's product threads or BLAS's,
and the choice between them (share_choice).

A room of kestrel_trio._model: its ranks among the others are in tests/test_architecture.py.
"""
