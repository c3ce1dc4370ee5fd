"""The numpy model core: config, safetensors reader, layers, KV cache, Qwen forward.

Imports numpy and the standard library only (never trio).
"""

from kestrel_trio._model.config import ModelConfig, read_config
from kestrel_trio._model.forward import Decoder, forward
from kestrel_trio._model.kv_cache import KVCache
from kestrel_trio._model.residency import load_weights

__all__ = ["ModelConfig", "read_config", "Decoder", "forward", "KVCache", "load_weights"]
