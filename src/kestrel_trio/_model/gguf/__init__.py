"""A GGUF file (llama.cpp's single-file format): its reader (header, metadata, tensor table, mapped
data), its tensor names as the Hugging Face names the loader checks, and its metadata as a ModelConfig
(validated by kestrel_trio._model.checkpoints.config, the room below).

A room of kestrel_trio._model: its ranks among the others are in tests/test_architecture.py.
"""
