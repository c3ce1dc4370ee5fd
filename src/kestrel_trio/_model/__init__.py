"""The numpy model core: config, safetensors reader, layers, KV cache, Qwen forward.

Imports numpy and the standard library only (never trio).
"""

from kestrel_trio._model.config import ModelConfig, read_config
from kestrel_trio._model.forward import Decoder, forward
from kestrel_trio._model.kv_cache import KVCache
from kestrel_trio._model.weights import load_weights

__all__ = ["ModelConfig", "read_config", "Decoder", "forward", "KVCache", "load_weights", "load_decoder"]


def load_decoder(folder, progress=None) -> Decoder:
    """Read config.json and every weight of the checkpoint in ``folder``; ``progress(fraction)`` as it reads."""
    config = read_config(folder)
    return Decoder.build(config, load_weights(folder, config, progress))
