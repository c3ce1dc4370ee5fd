"""What is cached (``kestrel-trio list``) and removing it (``kestrel-trio rm``).

Two caches: huggingface_hub's (shared with ``hf download`` and transformers;
scanned with its own ``scan_cache_dir``, emptied with its own delete
strategies, so its bookkeeping stays consistent) and kestrel-trio's own for
the named models. A hub repo is listed once per cached revision, and a GGUF
repo once per quant tag, under the name ``--model`` takes:
``owner/name``, ``owner/name@revision``, ``owner/name:Q4_K_M``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Iterable

import attrs

from kestrel_trio.errors import ModelLoadError
from kestrel_trio.hub.gguf_files import model_files
from kestrel_trio.hub.named import NAMED_MODELS, kestrel_cache_dir, named_model_path
from kestrel_trio.hub.names import close_names, did_you_mean, parse_hub_repo

__all__ = ["CachedModel", "cached_models", "remove_model"]

log = logging.getLogger("kestrel_trio.hub")


@attrs.frozen
class CachedModel:
    """One cached model.

    Attributes:
        id: the name that ``--model`` takes for it.
        format: "safetensors", "gguf" or "other" (a cached repo with no weights kestrel-trio reads).
        size: bytes on disk.
        path: what ``--model`` loads: a snapshot folder or a GGUF file.
    """

    id: str
    format: str
    size: int
    path: Path


def cached_models(hub_cache: Path, kestrel_cache: Path | None = None) -> list[CachedModel]:
    """Every cached model: the named ones first, then the hub's, by id."""
    found = [CachedModel(id=m.name, format="gguf", size=m.size, path=path)
             for m in NAMED_MODELS.values() if (path := named_model_path(m, kestrel_cache)) is not None]
    hub = [row for repo in _scan(hub_cache) for row in _repo_rows(repo)]
    return found + sorted(hub, key=lambda row: row.id)


def remove_model(name: str, hub_cache: Path, kestrel_cache: Path | None = None) -> int:
    """Delete a cached model (a named model, a repo, ``repo@revision`` or ``repo:TAG``); the bytes freed.

    Raises:
        ModelLoadError: nothing cached goes by ``name`` (code not_cached).
    """
    if name in NAMED_MODELS:
        path = Path(kestrel_cache or kestrel_cache_dir()) / NAMED_MODELS[name].filename
        if path.is_symlink() or path.exists():
            size = 0 if path.is_symlink() else path.stat().st_size  # a link frees no model bytes
            path.unlink()
            return size
        raise _not_cached(name, hub_cache, kestrel_cache)
    ref = parse_hub_repo(name)
    repos = [repo for repo in _scan(hub_cache) if ref is not None and repo.repo_id == ref.repo_id]
    if ref is None or not repos:
        raise _not_cached(name, hub_cache, kestrel_cache)
    info = _scan_info(hub_cache)
    revisions = [rev for rev in repos[0].revisions if _revision_matches(rev, ref.revision)]
    if not revisions:
        raise _not_cached(name, hub_cache, kestrel_cache)
    if ref.tag is None:
        strategy = info.delete_revisions(*(rev.commit_hash for rev in revisions))
    else:
        files = [file for rev in revisions for file in _tag_files(rev, ref.tag)]
        if not files:
            raise _not_cached(name, hub_cache, kestrel_cache)
        strategy = info.delete_files(*files)
    strategy.execute()
    return strategy.expected_freed_size


def _not_cached(name: str, hub_cache: Path, kestrel_cache: Path | None) -> ModelLoadError:
    hint = did_you_mean(close_names(name, NAMED_MODELS)) if name not in NAMED_MODELS and "/" not in name else ""
    return ModelLoadError(f"{name} is not cached{hint} (looked in {hub_cache} and "
                          f"{kestrel_cache or kestrel_cache_dir()}; `kestrel-trio list` shows what is)",
                          code="not_cached")


def _scan_info(hub_cache: Path) -> Any:
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        return scan_cache_dir(hub_cache)
    except CacheNotFound:
        return None


def _scan(hub_cache: Path) -> list[Any]:
    info = _scan_info(hub_cache) if Path(hub_cache).is_dir() else None
    if info is None:
        return []
    for warning in info.warnings:  # a corrupted repo folder: say so, list the rest
        log.warning("hub cache: %s", warning)
    return [repo for repo in info.repos if repo.repo_type == "model"]


def _repo_rows(repo: Any) -> Iterable[CachedModel]:
    for revision in repo.revisions:
        label = repo.repo_id + _revision_suffix(revision, len(repo.revisions))
        names = {file.file_path.relative_to(revision.snapshot_path).as_posix(): file for file in revision.files}
        weights = [name for name in names if name.endswith(".safetensors") and "/" not in name]
        if "config.json" in names and weights:
            size = sum(file.size_on_disk for name, file in names.items() if not name.endswith(".gguf"))
            yield CachedModel(id=label, format="safetensors", size=size, path=revision.snapshot_path)
        by_tag: dict[str, list[str]] = {}
        for gguf in model_files(names):
            by_tag.setdefault(gguf.tag or "", []).append(gguf.path)
        for tag, paths in sorted(by_tag.items()):
            yield CachedModel(id=label + (f":{tag}" if tag else ""), format="gguf",
                              size=sum(names[path].size_on_disk for path in paths),
                              path=revision.snapshot_path / sorted(paths)[0])
        if not by_tag and not ("config.json" in names and weights):
            yield CachedModel(id=label, format="other", size=revision.size_on_disk, path=revision.snapshot_path)


def _revision_suffix(revision: Any, count: int) -> str:
    """Nothing for the default branch; ``@ref`` or ``@commit`` for any other revision."""
    if "main" in revision.refs or (count == 1 and not revision.refs):
        return ""
    return "@" + (sorted(revision.refs)[0] if revision.refs else revision.commit_hash[:12])


def _revision_matches(revision: Any, wanted: str | None) -> bool:
    if wanted is None:
        return True
    return wanted in revision.refs or (len(wanted) >= 7 and revision.commit_hash.startswith(wanted))


def _tag_files(revision: Any, tag: str) -> list[Any]:
    names = {file.file_path.relative_to(revision.snapshot_path).as_posix(): file for file in revision.files}
    return [names[gguf.path] for gguf in model_files(names) if gguf.tag == tag]
