"""What a ``--model`` value names: a local folder or .gguf file, a hub repo, or a named model.

Pure parsing: nothing here touches the network; only :func:`parse_model_name`
looks at the file system (an existing path always wins over a repo id or a
name, as in transformers' ``from_pretrained``).
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Iterable

import attrs

from kestrel_trio.errors import ModelLoadError

__all__ = ["LocalModel", "HubRepo", "NamedRef", "parse_model_name", "parse_hub_repo", "close_names", "did_you_mean",
           "check_revision", "COMMIT_ID"]

COMMIT_ID = re.compile(r"[0-9a-f]{40}")
# git check-ref-format's rules: no component that starts with "." or ends with ".lock", no "..", "@{", "//",
# control characters, spaces or any of ~^:?*[\ ; not "@", not starting or ending with "/", not ending with ".".
# The revision becomes a path under the cache's refs/ folder, so these rules are what keeps it there.
_BAD_REF = re.compile(r"(^|/)\.|\.lock(/|$)|\.\.|@\{|//|[\x00-\x20\x7f~^:?*\[\\]|^/|/$|\.$|^@$")
_MAX_REF_LENGTH = 255

# owner/name as the hub spells it (huggingface_hub's validate_repo_id checks the finer rules),
# then an optional quant tag (llama.cpp's -hf convention) and revision, in either order.
_REPO = r"(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)"
_TAG = r"(?P<tag>[A-Za-z0-9_]+)"
_REV = r"(?P<rev>[^\s:@]+)"
_HUB_FORMS = (
    re.compile(rf"{_REPO}(?::{_TAG})?(?:@{_REV})?"),
    re.compile(rf"{_REPO}@{_REV}:{_TAG}"),
)


@attrs.frozen
class LocalModel:
    """A checkpoint folder or a .gguf file that exists on this machine."""

    path: Path


@attrs.frozen
class HubRepo:
    """A model repo on the hub.

    Attributes:
        repo_id: ``owner/name``.
        revision: a branch, tag or commit (None: the default branch, ``main``).
        tag: a GGUF quant tag such as ``Q4_K_M`` (upper-cased), or None.
    """

    repo_id: str
    revision: str | None = None
    tag: str | None = None

    @property
    def text(self) -> str:
        """The name as a user writes it: ``owner/name[:TAG][@revision]``."""
        return self.repo_id + (f":{self.tag}" if self.tag else "") + (f"@{self.revision}" if self.revision else "")


@attrs.frozen
class NamedRef:
    """One of the models kestrel-trio knows by a short name (see ``named.NAMED_MODELS``)."""

    name: str


def parse_hub_repo(text: str) -> HubRepo | None:
    """``owner/name[:TAG][@revision]`` (or ``owner/name@revision:TAG``) as a HubRepo; None if it is not one."""
    for form in _HUB_FORMS:
        match = form.fullmatch(text)
        if match is not None:
            repo_id = match["repo"]
            if "--" in repo_id or ".." in repo_id or repo_id.endswith((".git", ".", "-")):
                return None  # the hub refuses these names
            tag = match["tag"].upper() if match["tag"] else None
            if match["rev"] is not None:
                check_revision(match["rev"], text)
            return HubRepo(repo_id=repo_id, revision=match["rev"], tag=tag)
    return None


def check_revision(revision: str, name: str) -> None:
    """Refuse a revision that is neither a 40-hex commit id nor a valid git branch or tag name.

    Raises:
        ModelLoadError: naming ``name`` (what the user gave) and the revision.
    """
    if COMMIT_ID.fullmatch(revision):
        return
    if not revision or len(revision) > _MAX_REF_LENGTH or _BAD_REF.search(revision):
        raise ModelLoadError(f"{name}: revision {revision!r} is not a git branch, tag or 40-hex commit id",
                             code="not_found")


def parse_model_name(text: str, named: frozenset[str] | set[str]) -> LocalModel | HubRepo | NamedRef:
    """Classify a ``--model`` value.

    Args:
        text: what the user gave.
        named: the short names kestrel-trio knows (e.g. ``smollm2-135m``).

    Raises:
        ModelLoadError: ``text`` is a path that does not exist or is neither a
            folder nor a .gguf file, or it is not a path, repo id or known name.
    """
    path = Path(text).expanduser()
    if path.exists():
        return LocalModel(path)  # what it holds is the loader's to judge (kestrel_trio.model.check_model_folder)
    if text in named:
        return NamedRef(text)
    if text.lower().endswith(".gguf") or text.startswith((".", "/", "~")) or text.endswith("/"):
        raise ModelLoadError(f"{text}: no such checkpoint folder or GGUF file", code="not_found")
    repo = parse_hub_repo(text)
    if repo is not None:
        return repo
    close = close_names(text, named)
    if close:
        raise ModelLoadError(f"{text!r} is not a named model{did_you_mean(close)} (other models: a folder, "
                             "a .gguf file or a hub repo id, owner/name)", code="not_found")
    names = ", ".join(sorted(named))
    raise ModelLoadError(
        f"{text!r} is not a folder, a .gguf file, a hub repo id (owner/name, e.g. Qwen/Qwen3-0.6B, "
        f"or owner/name:QUANT for a GGUF repo) or a named model ({names})", code="not_found")


def close_names(text: str, named: Iterable[str]) -> list[str]:
    """The named models ``text`` is likely a slip for, best first (none: nothing close).

    The same name in another case (names are lower-case: ``smollm2-135M``),
    else the names it begins (``smollm2``), else difflib's close matches
    (``smollm-135m``, ``SmolLM2-135M-Instruct``).
    """
    by_lower = {name.lower(): name for name in named}
    lowered = text.strip().lower()
    if lowered in by_lower:
        return [by_lower[lowered]]
    starts = sorted(name for low, name in by_lower.items() if len(lowered) >= 3 and low.startswith(lowered))
    if starts:
        return starts
    return [by_lower[low] for low in difflib.get_close_matches(lowered, list(by_lower), n=3, cutoff=0.6)]


def did_you_mean(names: list[str]) -> str:
    """``": did you mean smollm2-135m?"`` (or ``"... a or b?"``) for an error message; "" for no names."""
    if not names:
        return ""
    return f": did you mean {' or '.join(names)}?"
