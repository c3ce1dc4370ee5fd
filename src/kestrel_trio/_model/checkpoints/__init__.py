"""A model's files: the folder confinement, config.json and GGUF metadata as a ModelConfig, the
safetensors and GGUF readers, tensor names and the shapes a config implies, random checkpoints.

A room of kestrel_trio._model: its ranks among the others are in tests/test_architecture.py.
"""
