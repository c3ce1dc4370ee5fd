"""How a matrix's rows are stored and expanded to float32: ggml's block types (dequant) and the
packed row forms a weight stays in (packed). The lowest room: it imports no other.

A room of kestrel_trio._model: its ranks among the others are in tests/test_architecture.py.
"""
