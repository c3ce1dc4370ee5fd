"""The KV cache: its storage dtypes, its blocks and the prefix cache that shares them between requests.

A room of kestrel_trio._model: its ranks among the others are in tests/test_architecture.py.
"""
