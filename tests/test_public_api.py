"""The public API is exactly __all__; changing it is a deliberate act."""

from __future__ import annotations

import kestrel_trio

EXPECTED = {
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
}


def test_all_is_pinned():
    assert set(kestrel_trio.__all__) == EXPECTED
    assert len(kestrel_trio.__all__) == len(EXPECTED)


def test_every_public_name_exists():
    for name in kestrel_trio.__all__:
        assert hasattr(kestrel_trio, name), name


def test_every_error_is_a_kestrel_error_with_a_status():
    for name in kestrel_trio.__all__:
        obj = getattr(kestrel_trio, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, kestrel_trio.KestrelError)
            assert 400 <= obj.status < 600
