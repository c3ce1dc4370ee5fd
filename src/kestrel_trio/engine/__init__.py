"""The engine: admission, a bounded queue of generation requests and the single inference task.

Imports trio and the model/text layers; never h11 or json. Its rooms: ``engine.step`` (the batched model
step, run in the worker thread, which never imports trio) and ``engine.memory`` (the KV budget and the
host memory it is derived from).
"""

from kestrel_trio.engine.embeddings import EmbeddingHandle, EmbeddingRequest, Embeddings
from kestrel_trio.engine.engine import Engine, GenerationHandle, run_engine
from kestrel_trio.engine.types import Delta, EngineLimits, GenerationRequest

__all__ = ["Engine", "GenerationHandle", "run_engine", "Delta", "EngineLimits", "GenerationRequest",
           "EmbeddingHandle", "EmbeddingRequest", "Embeddings"]
