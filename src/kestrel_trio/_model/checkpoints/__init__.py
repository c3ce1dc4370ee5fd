"""A model folder's files: the folder confinement, config.json as a ModelConfig, the safetensors
reader, the tensors and shapes a config implies, random checkpoints. A GGUF file has its own room
(kestrel_trio._model.gguf), above this one: its metadata becomes a config through config.json's checks.

A room of kestrel_trio._model: its ranks among the others are in tests/test_architecture.py.
"""
