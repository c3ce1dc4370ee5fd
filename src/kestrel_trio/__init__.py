"""kestrel-trio: an OpenAI-compatible server of Qwen and Llama-family models on trio, h11 and numpy.

The public API is exactly the names in ``__all__``.
"""

# First, before anything imports numpy: OpenBLAS reads its idle threads' spin time when it loads.
from kestrel_trio import blas_spin  # noqa: F401  isort: skip
from kestrel_trio.errors import (
    BadRequestError,
    ContextLengthError,
    EngineUnavailableError,
    KestrelError,
    ModelLoadError,
    OutOfMemoryError,
    QueueFullError,
)
from kestrel_trio.engine import Delta, Engine, EngineLimits, GenerationHandle, GenerationRequest, run_engine
from kestrel_trio.http import HttpLimits
from kestrel_trio.hub import resolve_model
from kestrel_trio.model import Model, load_demo_model, load_model
from kestrel_trio.app import ImagePolicy, VideoPolicy
from kestrel_trio.server import Server, serve
from kestrel_trio.text import SamplingParams
from kestrel_trio.text.repetition import RepetitionGuard
from kestrel_trio.text.sampling import SamplingDefaults
from kestrel_trio.version import __version__


__all__ = [
    "__version__",
    "Model",
    "load_model",
    "load_demo_model",
    "resolve_model",
    "SamplingParams",
    "SamplingDefaults",
    "RepetitionGuard",
    "Engine",
    "EngineLimits",
    "GenerationRequest",
    "GenerationHandle",
    "Delta",
    "run_engine",
    "HttpLimits",
    "Server",
    "serve",
    "KestrelError",
    "ModelLoadError",
    "BadRequestError",
    "ContextLengthError",
    "QueueFullError",
    "EngineUnavailableError",
    "OutOfMemoryError",
    "ImagePolicy",
    "VideoPolicy",
]
