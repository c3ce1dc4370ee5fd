"""Sentence embeddings: a decoder's final hidden states pooled and L2-normalized (pooling).

A room of kestrel_trio._model: its ranks among the others are in tests/test_architecture.py.
"""
