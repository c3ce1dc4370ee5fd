"""kestrel-trio: an OpenAI-compatible Qwen server on trio, h11 and numpy.

The public API is exactly the names in ``__all__``.
"""

from kestrel_trio.errors import (
    BadRequestError,
    ContextLengthError,
    EngineUnavailableError,
    GenerationCancelled,
    KestrelError,
    ModelLoadError,
    QueueFullError,
)
from kestrel_trio.model import Model, load_model

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "Model",
    "load_model",
    "KestrelError",
    "ModelLoadError",
    "BadRequestError",
    "ContextLengthError",
    "QueueFullError",
    "EngineUnavailableError",
    "GenerationCancelled",
]
