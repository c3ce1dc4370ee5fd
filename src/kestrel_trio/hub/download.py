"""Hub repos into huggingface_hub's own cache: only the files a model needs, checked for space first.

Theory of operation. :func:`fetch_hub_model` takes a :class:`HubRepo` to a
local path in five steps:

1. Ask the hub for the revision's file list (``GET /api/models/{repo}/revision/{rev}?blobs=true``:
   the commit, and each file's size and blob id or LFS sha256).
2. Choose the files. A quant tag, or a repo with GGUF files and no config.json:
   the GGUF file that tag names, every shard of it, and the repo's vision
   projector (``mmproj``) if it has one, as llama.cpp's ``-hf`` does
   (``gguf_files``). Otherwise
   config.json and the tokenizer/template files the loader reads, then the
   weights that model.safetensors.index.json names (or model.safetensors), and
   preprocessor_config.json when config.json says Qwen3-VL (config.json and the
   index, a few KiB, are fetched first to know that). Nothing else: no README,
   other formats, or subfolders.
3. Refuse before the download when the disk cannot hold the files not yet in the cache.
4. ``hf_hub_download`` each file pinned to the commit: a cached file costs no
   request (so a model fetched by ``hf download`` or transformers is reused);
   a new one is a HEAD and a GET into ``blobs/``, resumed with a Range request
   when the connection drops mid-file (huggingface_hub retries five times).
5. Record ``refs/{revision}`` so that an offline run finds the snapshot.

When the hub cannot be asked (``HF_HUB_OFFLINE``, no connection, a 5xx), the
snapshot the cache already holds for that revision is used if it is complete;
otherwise one line says which repo and why. Every huggingface_hub error is
translated into a one-line :class:`ModelLoadError` with a ``code``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any, Iterable, TextIO

import attrs

from kestrel_trio._model import confined
from kestrel_trio.errors import ModelLoadError
from kestrel_trio.hub.gguf_files import model_files, parse_gguf_name, select_gguf, select_mmproj
from kestrel_trio.hub.names import COMMIT_ID, HubRepo, check_revision
from kestrel_trio.hub.progress import DownloadProgress, format_bytes

__all__ = ["HubSettings", "HubFetch", "fetch_hub_model", "repo_folder", "NEEDED_SMALL_FILES", "DISK_MARGIN"]

log = logging.getLogger("kestrel_trio.hub")

# What the loaders read beside the weights (model.load_model, text.Tokenizer.from_folder).
NEEDED_SMALL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                      "chat_template.jinja")
_VL_FILES = ("preprocessor_config.json",)  # text.media.images.ImageProcessorConfig, Qwen3-VL only
_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"
_VL_ARCHITECTURES = {"Qwen3VLForConditionalGeneration"}
DISK_MARGIN = 64 * 2**20  # bytes left free after a download, so the disk never fills to its last byte
_COMMIT = COMMIT_ID


@attrs.frozen
class HubSettings:
    """Where and how to reach the hub.

    Attributes:
        endpoint: the hub's base URL (``HF_ENDPOINT``; https://huggingface.co).
        cache_dir: huggingface_hub's cache (``HF_HUB_CACHE``, from ``HF_HOME``; ~/.cache/huggingface/hub).
        token: the access token (``HF_TOKEN`` or ``hf auth login``'s file), or None.
        offline: ``HF_HUB_OFFLINE``: use the cache only.
    """

    endpoint: str
    cache_dir: Path
    token: str | None = None
    offline: bool = False

    @classmethod
    def from_environment(cls) -> HubSettings:
        """The settings huggingface_hub itself uses (its environment variables, read when it was imported)."""
        from huggingface_hub import constants, get_token

        return cls(endpoint=constants.ENDPOINT, cache_dir=Path(constants.HF_HUB_CACHE), token=get_token(),
                   offline=constants.is_offline_mode())


@attrs.frozen
class HubFetch:
    """A hub model on disk.

    Attributes:
        path: what to load: the snapshot folder, or the (first) GGUF file in it.
        commit: the commit the snapshot is of.
        files: the repo paths the model uses.
        downloaded: bytes fetched by this call (0 when everything was cached).
        mmproj: a GGUF repo's vision projector file, fetched beside the model; None when it has none.
    """

    path: Path
    commit: str
    files: tuple[str, ...]
    downloaded: int
    mmproj: Path | None = None


@attrs.frozen
class _RemoteFile:
    path: str
    size: int
    blob: str | None  # the name of its blob in the cache: the LFS sha256, else the git blob id


def repo_folder(cache_dir: Path, repo_id: str) -> Path:
    """The folder huggingface_hub keeps a model repo in: ``models--owner--name``."""
    return Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))


def fetch_hub_model(ref: HubRepo, settings: HubSettings, *, stream: TextIO | None = None) -> HubFetch:
    """Make ``ref``'s model files local (downloading only what the cache lacks) and say where they are.

    Args:
        ref: the repo, revision and quant tag.
        settings: endpoint, cache, token, offline mode.
        stream: where a terminal progress bar goes (stderr).

    Raises:
        ModelLoadError: one line naming the repo and the reason (``code``:
            not_cached, repo_not_found, gated, revision_not_found, no_such_quant,
            no_gguf, missing_shard, not_a_model, disk_full, download_failed).
    """
    _check_repo_id(ref.repo_id)
    if ref.revision is not None:
        check_revision(ref.revision, ref.text)  # it becomes a path under refs/: never one outside the cache
    _quiet_http_logs()
    if settings.offline:
        return _from_cache(ref, settings, "HF_HUB_OFFLINE is set, so nothing can be downloaded")
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    try:
        info = HfApi(endpoint=settings.endpoint).model_info(
            ref.repo_id, revision=ref.revision or "main", files_metadata=True, token=settings.token or False)
    except _transport_errors() as exc:
        return _from_cache(ref, settings, _unreachable_reason(exc, settings))
    except HfHubHTTPError as exc:
        status = _status(exc)
        if status is not None and (status >= 500 or status == 429):
            return _from_cache(ref, settings, f"{settings.endpoint} answered HTTP {status}")
        raise _hub_error(ref, settings, exc, "") from None
    if not info.sha:
        raise ModelLoadError(f"{ref.text}: {settings.endpoint} sent no commit for this revision",
                             code="download_failed")
    if not _COMMIT.fullmatch(info.sha):  # it names the snapshot folder: a mirror must not pick the path
        raise ModelLoadError(f"{ref.text}: {settings.endpoint} sent {info.sha[:60]!r} as the commit, "
                             "not a 40-hex commit id", code="download_failed")
    return _Download(ref, settings, info.sha, _remote_files(info), stream).run()


class _Download:
    """One fetch of a repo at a known commit (steps 2-5 of the theory of operation)."""

    def __init__(self, ref: HubRepo, settings: HubSettings, commit: str, remote: dict[str, _RemoteFile],
                 stream: TextIO | None) -> None:
        self.ref, self.settings, self.commit, self.remote, self.stream = ref, settings, commit, remote, stream
        self.storage = repo_folder(settings.cache_dir, ref.repo_id)
        self.snapshot = self.storage / "snapshots" / commit
        self.downloaded = 0

    def run(self) -> HubFetch:
        projector = None
        if _wants_gguf(self.ref, self.remote):
            files = select_gguf(self.remote, self.ref.tag, repo=self.ref.text)
            projector = _projector(self.remote, files)
            files += [projector] if projector is not None else []
            self._fetch(files, progress=True)
        else:
            if "config.json" not in self.remote:
                raise ModelLoadError(f"{self.ref.text} has neither config.json nor a GGUF file: not a model "
                                     "kestrel-trio can load", code="not_a_model")
            # config.json and the index (a few KiB) say which other files the model needs; those are
            # checked for space together and downloaded with one progress bar.
            first = [name for name in ("config.json", _INDEX) if name in self.remote]
            self._fetch(first, progress=False)
            rest = [name for name in NEEDED_SMALL_FILES if name in self.remote and name not in first]
            rest += self._weights() + [name for name in self._extra_files() if name in self.remote]
            self._fetch(rest, progress=True)
            files = first + rest
        _write_ref(self.storage, self.ref.revision or "main", self.commit)
        path = self.snapshot / files[0] if _wants_gguf(self.ref, self.remote) else self.snapshot
        return HubFetch(path=path, commit=self.commit, files=tuple(files), downloaded=self.downloaded,
                        mmproj=self.snapshot / projector if projector is not None else None)

    def _weights(self) -> list[str]:
        if _INDEX in self.remote:
            shards = _index_shards(self.snapshot / _INDEX, self.ref.text)
            for name in shards:  # a hostile mirror's index must not make us write or read outside the snapshot
                try:
                    confined(self.snapshot, name, named_by=_INDEX)
                except ModelLoadError as exc:
                    raise ModelLoadError(f"{self.ref.text}: {exc.message}", code="not_a_model") from None
            missing = [name for name in shards if name not in self.remote]
            if missing:
                raise ModelLoadError(f"{self.ref.text}: {_INDEX} names {missing[0]}, which is not in the repo",
                                     code="missing_shard")
            return shards
        if _SINGLE in self.remote:
            return [_SINGLE]
        raise ModelLoadError(f"{self.ref.text} has no {_SINGLE} or {_INDEX} (kestrel-trio reads safetensors "
                             "weights, or a GGUF file: name one with owner/name:QUANT)", code="not_a_model")

    def _extra_files(self) -> list[str]:
        try:
            config = json.loads((self.snapshot / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return []  # the loader reports a broken config.json, naming what is wrong
        architectures = config.get("architectures") if isinstance(config, dict) else None
        return list(_VL_FILES) if _VL_ARCHITECTURES & set(architectures or ()) else []

    def _fetch(self, names: list[str], *, progress: bool) -> None:
        """Put ``names`` in the snapshot; only the ones whose blob is not cached yet cost a download."""
        absent = [self.remote[name] for name in names if not (self.snapshot / name).is_file()]
        if not absent:
            return
        new = [f for f in absent if f.blob is None or not (self.storage / "blobs" / f.blob).is_file()]
        total = sum(f.size for f in new)
        _check_disk_space(self.ref.text, total, self.settings.cache_dir)
        bar = DownloadProgress(self.ref.text, total, self.stream) if progress and new else None
        if bar is not None:
            log.info("downloading %s: %d file(s), %s into %s", self.ref.text, len(new), format_bytes(total),
                     self.settings.cache_dir)
        try:
            for remote_file in absent:  # a cached blob is only linked into this snapshot (one HEAD request)
                self._download(remote_file.path, bar)
                self.downloaded += remote_file.size if remote_file in new else 0
        finally:
            if bar is not None:
                bar.finish()

    def _download(self, name: str, bar: DownloadProgress | None) -> None:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

        try:
            hf_hub_download(self.ref.repo_id, name, revision=self.commit, cache_dir=str(self.settings.cache_dir),
                            endpoint=self.settings.endpoint, token=self.settings.token or False,
                            tqdm_class=bar.tqdm_class() if bar is not None else None)
        except HfHubHTTPError as exc:
            raise _hub_error(self.ref, self.settings, exc, name) from None
        except LocalEntryNotFoundError as exc:  # the HEAD request failed: the connection went away
            cause = exc.__cause__ or exc
            raise ModelLoadError(f"{self.ref.text}: downloading {name} failed: "
                                 f"{_unreachable_reason(cause, self.settings)}", code="download_failed") from None
        except (*_transport_errors(), OSError) as exc:
            raise ModelLoadError(f"{self.ref.text}: downloading {name} failed: {_one_line(exc)}",
                                 code="download_failed") from None


def _projector(paths: Iterable[str], model: list[str]) -> str | None:
    """The repo's mmproj file to fetch beside the GGUF model ``model`` (its files), or None."""
    name = parse_gguf_name(model[0])
    return select_mmproj(paths, name.tag if name is not None else None)


def _wants_gguf(ref: HubRepo, files: Iterable[str]) -> bool:
    """A quant tag, or a repo that holds GGUF models and no config.json (a typical -GGUF repo)."""
    names = list(files)
    return ref.tag is not None or ("config.json" not in names and bool(model_files(names)))


def _remote_files(info: Any) -> dict[str, _RemoteFile]:
    files = {}
    for sibling in info.siblings or ():
        lfs = sibling.lfs
        size = lfs.size if lfs is not None else sibling.size
        files[sibling.rfilename] = _RemoteFile(path=sibling.rfilename, size=int(size or 0),
                                               blob=lfs.sha256 if lfs is not None else sibling.blob_id)
    return files


def _index_shards(index: Path, label: str) -> list[str]:
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        return sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelLoadError(f"{label}: {_INDEX} is not a valid safetensors index ({exc})",
                             code="not_a_model") from None


def _check_disk_space(label: str, needed: int, cache_dir: Path) -> None:
    """Refuse before downloading when the cache's disk cannot hold ``needed`` bytes (plus DISK_MARGIN)."""
    probe = Path(cache_dir)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < needed + DISK_MARGIN:
        raise ModelLoadError(f"not enough disk space for {label}: its files need {format_bytes(needed)} and "
                             f"{probe} has {format_bytes(free)} free", code="disk_full")


def _write_ref(storage: Path, revision: str, commit: str) -> None:
    """``refs/{revision}`` holds the commit (as huggingface_hub writes it), atomically."""
    if revision == commit:
        return
    ref = storage / "refs" / revision
    try:
        if ref.is_file() and ref.read_text() == commit:
            return
        ref.parent.mkdir(parents=True, exist_ok=True)
        temporary = ref.with_name(f"{ref.name}.{uuid.uuid4().hex[:8]}.tmp")
        temporary.write_text(commit)
        os.replace(temporary, ref)
    except OSError as exc:  # a read-only cache still serves this run; only the next offline run misses it
        log.warning("could not record %s as %s's %s: %s", commit, storage.name, revision, exc)


def _from_cache(ref: HubRepo, settings: HubSettings, reason: str) -> HubFetch:
    """The snapshot the cache holds for ``ref``'s revision, if it has the model's files."""
    storage = repo_folder(settings.cache_dir, ref.repo_id)
    revision = ref.revision or "main"
    commit = revision if _COMMIT.fullmatch(revision) else _read_ref(storage, revision)
    snapshot = storage / "snapshots" / commit if commit else None
    if snapshot is None or not snapshot.is_dir():
        raise ModelLoadError(f"{ref.text} is not in the local cache ({settings.cache_dir}) and {reason}",
                             code="not_cached")
    names = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())
    projector = None
    if _wants_gguf(ref, names):
        try:
            files = select_gguf(names, ref.tag, repo=f"the cached copy of {ref.text}")
        except ModelLoadError as exc:
            raise ModelLoadError(f"{exc.message}, and {reason}", code=exc.code) from None
        path = snapshot / files[0]
        projector = _projector(names, files)
        files += [projector] if projector is not None else []
    else:
        needed = ["config.json"]
        if (snapshot / _INDEX).is_file():
            needed += _index_shards(snapshot / _INDEX, ref.text)
        else:
            needed.append(_SINGLE)
        absent = [name for name in needed if name not in names]
        if absent:
            raise ModelLoadError(f"the cached copy of {ref.text} lacks {absent[0]} and {reason}", code="not_cached")
        files, path = needed, snapshot
    log.info("using the cached %s (commit %s): %s", ref.text, commit[:12], reason)
    return HubFetch(path=path, commit=commit, files=tuple(files), downloaded=0,
                    mmproj=snapshot / projector if projector is not None else None)


def _read_ref(storage: Path, revision: str) -> str | None:
    try:
        commit = (storage / "refs" / revision).read_text(errors="replace").strip()
        return commit if _COMMIT.fullmatch(commit) else None  # it names a folder: only a commit id may
    except OSError:
        return None


def _check_repo_id(repo_id: str) -> None:
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise ModelLoadError(f"{repo_id!r} is not a valid hub repo id: {_one_line(exc)}", code="not_found") from None


def _quiet_http_logs() -> None:
    """Keep the HTTP client's line per request (INFO) out of the CLI's log unless DEBUG was asked for."""
    if logging.getLogger().getEffectiveLevel() <= logging.DEBUG:
        return
    for name in ("httpx2", "httpcore2", "httpx", "httpcore"):
        client_log = logging.getLogger(name)
        if client_log.level == logging.NOTSET:
            client_log.setLevel(logging.WARNING)


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Exceptions meaning the hub could not be reached (huggingface_hub 2 speaks HTTP through httpx2)."""
    from huggingface_hub.errors import OfflineModeIsEnabled

    errors: tuple[type[BaseException], ...] = (OfflineModeIsEnabled, ConnectionError, TimeoutError)
    try:
        import httpx2
    except ImportError:
        return errors
    return (*errors, httpx2.TransportError)


def _unreachable_reason(exc: BaseException, settings: HubSettings) -> str:
    from huggingface_hub.errors import OfflineModeIsEnabled

    if isinstance(exc, OfflineModeIsEnabled):
        return "HF_HUB_OFFLINE is set, so nothing can be downloaded"
    return f"{settings.endpoint} cannot be reached ({type(exc).__name__}: {_one_line(exc)})"


def _status(exc: Any) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def _hub_error(ref: HubRepo, settings: HubSettings, exc: Exception, file: str) -> ModelLoadError:
    """One line for an HTTP error of the hub, naming the repo and what to do."""
    from huggingface_hub.errors import GatedRepoError, RemoteEntryNotFoundError, RepositoryNotFoundError, \
        RevisionNotFoundError

    page = f"{settings.endpoint}/{ref.repo_id}"
    status = _status(exc)
    if isinstance(exc, GatedRepoError):
        if settings.token:
            return ModelLoadError(f"{ref.text} is a gated repo and the token in use has no access to it "
                                  f"(HTTP {status}): request access at {page}", code="gated")
        return ModelLoadError(f"{ref.text} is a gated repo: accept its conditions at {page}, then set HF_TOKEN "
                              "(or run `hf auth login`)", code="gated")
    if isinstance(exc, RepositoryNotFoundError):
        hint = ("or the token in use cannot see it" if settings.token
                else "or it is private or gated and needs HF_TOKEN")
        return ModelLoadError(f"{ref.text}: no such folder here, and {settings.endpoint} has no model repo "
                              f"{ref.repo_id} (HTTP {status}; {hint})", code="repo_not_found")
    if isinstance(exc, RevisionNotFoundError):
        return ModelLoadError(f"{ref.repo_id} has no revision {ref.revision or 'main'!r} (HTTP {status})",
                              code="revision_not_found")
    if isinstance(exc, RemoteEntryNotFoundError):
        return ModelLoadError(f"{ref.text}: {file} is listed by the hub but cannot be downloaded (HTTP {status})",
                              code="download_failed")
    what = f"downloading {file}" if file else "asking for its files"
    return ModelLoadError(f"{ref.text}: {what} failed: {settings.endpoint} answered HTTP {status}",
                          code="download_failed")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
