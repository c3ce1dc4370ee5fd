"""A stand-in for the Hugging Face hub on 127.0.0.1: the part of its HTTP API that huggingface_hub downloads with.

Written against huggingface_hub 2.4's own source (hf_api.model_info,
file_download.get_hf_file_metadata / http_get, utils/_http.hf_raise_for_status):

- ``GET /api/models/{owner}/{name}/revision/{rev}?blobs=true``: JSON with the
  commit (``sha``), ``gated`` and ``siblings`` (``rfilename``, ``size``,
  ``blobId``, and ``lfs`` {size, sha256, pointerSize} for LFS files).
- ``HEAD``/``GET /{owner}/{name}/resolve/{rev}/{path}``: a plain file answers
  200 with ``ETag`` (its git blob id), ``X-Repo-Commit`` and
  ``Content-Length``; an LFS file (weights) answers 302 with ``Location`` on a
  second server (the "CDN", another origin, so huggingface_hub stops there and
  drops the token), ``X-Linked-Etag`` (its sha256) and ``X-Linked-Size``.
- The CDN serves ``GET /blobs/{sha256}``, with ``Range: bytes=N-`` as 206
  ``Content-Range`` (a resumed download).
- Errors carry ``X-Error-Code`` as the hub's do: ``RepoNotFound`` (401 without
  a token, 404 with one, as the hub answers), ``RevisionNotFound``,
  ``EntryNotFound``, ``GatedRepo`` (401 without a token, 403 with a wrong one).

Every request is counted per file, and a file can be set to have its first
download cut after N bytes (the connection closed mid-body).
"""

from __future__ import annotations

import collections
import hashlib
import http.server
import json
import socket
import threading
import urllib.parse
from pathlib import Path

import attrs

HOST = "127.0.0.1"
LFS_SUFFIXES = (".safetensors", ".gguf", ".bin", ".npz", ".onnx", ".pt")


def git_blob_id(data: bytes) -> str:
    """The git object id of a file's bytes: what the hub reports as blobId and sends as ETag."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@attrs.define
class FakeRepo:
    """A repo's snapshots (commit -> files) and refs (branch or tag -> commit)."""

    snapshots: dict[str, dict[str, bytes]]
    refs: dict[str, str]
    gated: bool = False

    def files_at(self, revision: str) -> tuple[str, dict[str, bytes]] | None:
        commit = self.refs.get(revision, revision)
        return (commit, self.snapshots[commit]) if commit in self.snapshots else None


class FakeHub:
    """The hub and its CDN, each a threaded ``http.server`` on 127.0.0.1 port 0; use as a context manager.

    Attributes:
        url: the hub's base URL (``HF_ENDPOINT``).
        token: the token a gated repo accepts.
        gets: repo -> Counter of file paths whose bytes were requested (resolve GETs and CDN GETs).
        heads: repo -> Counter of file paths asked about with HEAD.
        api_calls: how many revision-info requests arrived.
        ranges: file path -> the Range headers of its CDN GETs, in order (None: no Range).
        body_bytes: file path -> body bytes sent for it in all.
        cut_after: file path -> N: its first CDN GET closes the connection after N body bytes.
        claimed_sizes: file path -> the size the revision info reports instead of the real one.
        broken: file paths whose CDN GETs answer 500.
    """

    def __init__(self, token: str = "hf_test_token") -> None:
        self.token = token
        self.repos: dict[str, FakeRepo] = {}
        self.gets: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.heads: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.api_calls = 0
        self.ranges: dict[str, list[str | None]] = collections.defaultdict(list)
        self.body_bytes: collections.Counter = collections.Counter()
        self.cut_after: dict[str, int] = {}
        self.claimed_sizes: dict[str, int] = {}
        self.broken: set[str] = set()
        self._blobs: dict[str, tuple[str, str, bytes]] = {}  # sha256 -> (repo, path, bytes)
        self._lock = threading.Lock()
        self._servers: list[http.server.ThreadingHTTPServer] = []
        self.url = self.cdn_url = ""

    def add_repo(self, repo_id: str, files: dict[str, bytes], *, gated: bool = False,
                 revisions: dict[str, dict[str, bytes]] | None = None) -> str:
        """Publish a repo; its main commit. ``revisions`` adds branches or tags with files of their own."""
        def commit_of(name: str) -> str:
            return hashlib.sha1(f"{repo_id}@{name}".encode()).hexdigest()

        repo = FakeRepo(snapshots={commit_of("main"): dict(files)}, refs={"main": commit_of("main")}, gated=gated)
        for name, other in (revisions or {}).items():
            repo.snapshots[commit_of(name)] = dict(other)
            repo.refs[name] = commit_of(name)
        self.repos[repo_id] = repo
        return commit_of("main")

    def add_folder(self, repo_id: str, folder: Path, extra: dict[str, bytes] | None = None, **options) -> str:
        """Publish a fixture folder's files (plus ``extra``) as a repo."""
        files = {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir()) if p.is_file()}
        return self.add_repo(repo_id, {**files, **(extra or {})}, **options)

    def __enter__(self) -> FakeHub:
        for role in ("hub", "cdn"):
            server = http.server.ThreadingHTTPServer((HOST, 0), _Handler)
            server.daemon_threads = True
            server.fake_hub = self  # type: ignore[attr-defined]
            server.role = role  # type: ignore[attr-defined]
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
            self._servers.append(server)
        self.url = f"http://{HOST}:{self._servers[0].server_address[1]}"
        self.cdn_url = f"http://{HOST}:{self._servers[1].server_address[1]}"
        return self

    def __exit__(self, *exc_info: object) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()

    def downloaded(self, repo_id: str) -> set[str]:
        """The files of ``repo_id`` whose bytes were requested at least once."""
        return set(self.gets[repo_id])

    # -- request handling -------------------------------------------------------------------------------------

    def _sha256(self, repo_id: str, path: str, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        self._blobs[digest] = (repo_id, path, data)
        return digest

    def revision_info(self, handler: _Handler, repo_id: str, revision: str) -> None:
        with self._lock:
            self.api_calls += 1
        if repo_id not in self.repos:
            return handler.error(self._not_found_status(handler), "RepoNotFound", "Repository not found")
        snapshot = self.repos[repo_id].files_at(revision)
        if snapshot is None:
            return handler.error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        commit, files = snapshot
        siblings = []
        for path, data in sorted(files.items()):
            size = self.claimed_sizes.get(path, len(data))
            entry: dict = {"rfilename": path, "size": size, "blobId": git_blob_id(data)}
            if path.endswith(LFS_SUFFIXES):
                entry["lfs"] = {"size": size, "sha256": self._sha256(repo_id, path, data), "pointerSize": 134}
            siblings.append(entry)
        body = {"_id": commit[:24], "id": repo_id, "modelId": repo_id, "sha": commit,
                "private": False, "gated": "manual" if self.repos[repo_id].gated else False, "disabled": False,
                "tags": [], "siblings": siblings}
        handler.send_body(200, json.dumps(body).encode(), {"Content-Type": "application/json"})

    def resolve(self, handler: _Handler, repo_id: str, revision: str, path: str) -> None:
        if repo_id not in self.repos:
            return handler.error(self._not_found_status(handler), "RepoNotFound", "Repository not found")
        snapshot = self.repos[repo_id].files_at(revision)
        if snapshot is None:
            return handler.error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        commit, files = snapshot
        commit_header = {"X-Repo-Commit": commit}
        if self.repos[repo_id].gated:
            given = handler.headers.get("Authorization")
            if given != f"Bearer {self.token}":
                status = 401 if given is None else 403
                return handler.error(status, "GatedRepo", f"Access to model {repo_id} is restricted.", commit_header)
        if path not in files:
            return handler.error(404, "EntryNotFound", f"{path} does not exist on \"{revision}\"", commit_header)
        data = files[path]
        with self._lock:
            (self.heads if handler.command == "HEAD" else self.gets)[repo_id][path] += 1
        if path.endswith(LFS_SUFFIXES):
            digest = self._sha256(repo_id, path, data)
            headers = {**commit_header, "Location": f"{self.cdn_url}/blobs/{digest}", "X-Linked-Size": str(len(data)),
                       "X-Linked-Etag": f'"{digest}"', "ETag": f'"{git_blob_id(data)}"'}
            return handler.send_body(302, b"", headers)
        headers = {**commit_header, "ETag": f'"{git_blob_id(data)}"', "Accept-Ranges": "bytes"}
        handler.send_body(200, data, headers)

    def blob(self, handler: _Handler, digest: str) -> None:
        if digest not in self._blobs:
            return handler.error(404, None, "no such blob")
        repo_id, path, data = self._blobs[digest]
        range_header = handler.headers.get("Range")
        with self._lock:
            if handler.command == "GET":
                self.gets[repo_id][path] += 1
                self.ranges[path].append(range_header)
            cut = self.cut_after.pop(path, None) if handler.command == "GET" else None
        if path in self.broken:
            return handler.error(500, None, "storage unavailable")
        start = int(range_header.removeprefix("bytes=").split("-")[0]) if range_header else 0
        part = data[start:]
        headers = {"ETag": f'"{digest}"', "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        status = 200
        if range_header:
            status = 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        with self._lock:  # counted before sending: the client may check the count as soon as its read ends
            self.body_bytes[path] += len(part) if cut is None else min(cut, len(part))
        handler.send_body(status, part, headers, cut_after=cut)

    def _not_found_status(self, handler: _Handler) -> int:
        return 404 if handler.headers.get("Authorization") else 401  # the hub hides private repos this way


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: http.server.ThreadingHTTPServer

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        return None

    def do_HEAD(self) -> None:
        self._route()

    def do_GET(self) -> None:
        self._route()

    def _route(self) -> None:
        hub: FakeHub = self.server.fake_hub  # type: ignore[attr-defined]
        parts = [urllib.parse.unquote(p) for p in urllib.parse.urlsplit(self.path).path.split("/")[1:]]
        if self.server.role == "cdn":  # type: ignore[attr-defined]
            if len(parts) == 2 and parts[0] == "blobs":
                return hub.blob(self, parts[1])
        elif parts[:2] == ["api", "models"] and len(parts) >= 4:
            revision = parts[5] if len(parts) == 6 and parts[4] == "revision" else "main"
            return hub.revision_info(self, f"{parts[2]}/{parts[3]}", revision)
        elif len(parts) >= 5 and parts[2] == "resolve":
            return hub.resolve(self, f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]))
        self.error(404, None, "no such route")

    def error(self, status: int, code: str | None, message: str, headers: dict[str, str] | None = None) -> None:
        extra = {**(headers or {}), "X-Error-Message": message, "Content-Type": "application/json"}
        if code:
            extra["X-Error-Code"] = code
        self.send_body(status, json.dumps({"error": message}).encode(), extra)

    def send_body(self, status: int, body: bytes, headers: dict[str, str], *, cut_after: int | None = None) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if cut_after is None:
            self.wfile.write(body)
            return
        self.wfile.write(body[:cut_after])
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)  # mid-body: the client sees the connection drop
