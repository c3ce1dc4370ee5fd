"""Which GGUF file of a repo a quant tag names (llama.cpp's ``-hf owner/name:TAG`` convention).

A GGUF file's quant tag is the last ``-`` or ``.`` separated word of its name,
once ``.gguf`` and a split suffix are taken off:
``Qwen3-8B-Q4_K_M.gguf`` -> ``Q4_K_M``, ``SmolLM2-135M-Instruct.Q4_1.gguf`` ->
``Q4_1``, ``qwen2.5-7b-q5_k_m-00001-of-00002.gguf`` -> ``Q5_K_M`` (shard 1 of 2).
Tags compare case-insensitively and whole (``Q4_0`` does not pick ``IQ4_0``).
Projector, imatrix and draft-model files (``mmproj``, ``imatrix``, ``mtp-``,
``eagle3-``) are never the model. With no tag the choice is llama.cpp's:
Q4_K_M, else Q8_0, else the first model file.

A repo's vision projector (``mmproj-*.gguf``, as llama.cpp's ``-hf`` fetches
it beside the model) is chosen by :func:`select_mmproj`: the one of the
model's own quant tag, else F16, BF16, F32, Q8_0, else the first by name.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Iterable

import attrs

from kestrel_trio.errors import ModelLoadError

__all__ = ["GgufName", "parse_gguf_name", "model_files", "quant_tags", "select_gguf", "select_mmproj", "DEFAULT_TAGS",
           "MMPROJ_TAGS"]

DEFAULT_TAGS = ("Q4_K_M", "Q8_0")  # tried in order when no tag is given, as llama.cpp does
_SPLIT = re.compile(r"(?P<prefix>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})", re.IGNORECASE)
_TAG = re.compile(r"[-.](?P<tag>[A-Za-z0-9_]+)")
_NOT_A_MODEL = ("mmproj", "imatrix", "mtp-", "eagle3-")
MMPROJ_TAGS = ("F16", "BF16", "F32", "Q8_0")  # a projector's tags in order of preference, after the model's own


@attrs.frozen
class GgufName:
    """What a GGUF file's path says about it.

    Attributes:
        path: the path inside the repo.
        prefix: the path without ``.gguf`` and the split suffix (shards of one model share it).
        tag: the quant tag, upper-case, or None when the name carries none.
        index: the shard number, 1-based (1 for an unsplit file).
        count: how many shards the model has (1 for an unsplit file).
    """

    path: str
    prefix: str
    tag: str | None
    index: int
    count: int


def parse_gguf_name(path: str) -> GgufName | None:
    """The parts of a GGUF file name; None when ``path`` does not end in ``.gguf``."""
    if not path.lower().endswith(".gguf"):
        return None
    prefix = path[: -len(".gguf")]
    index = count = 1
    split = _SPLIT.fullmatch(prefix)
    if split is not None:
        prefix, index, count = split["prefix"], int(split["index"]), int(split["count"])
    words = PurePosixPath(prefix).name
    tag = None
    for tag_match in _TAG.finditer(words):
        tag = tag_match["tag"].upper()  # the last one wins
    return GgufName(path=path, prefix=prefix, tag=tag, index=index, count=count)


def model_files(paths: Iterable[str]) -> list[GgufName]:
    """The GGUF files among ``paths`` that hold a model (not a projector, imatrix or draft), in name order."""
    found = []
    for path in sorted(paths):
        name = parse_gguf_name(path)
        if name is not None and not any(word in PurePosixPath(path).name.lower() for word in _NOT_A_MODEL):
            found.append(name)
    return found


def quant_tags(paths: Iterable[str]) -> list[str]:
    """The quant tags of the model files among ``paths``, sorted."""
    return sorted({name.tag for name in model_files(paths) if name.tag is not None})


def select_gguf(paths: Iterable[str], tag: str | None, *, repo: str) -> list[str]:
    """The file (or every shard, in order) of the model with quant tag ``tag`` among a repo's ``paths``.

    Args:
        paths: the repo's file paths.
        tag: the quant tag (any case), or None for the default choice.
        repo: the repo's name, for error messages.

    Raises:
        ModelLoadError: no GGUF model file, no file with that tag (the message
            lists the tags that exist), or a split model with a shard missing.
    """
    paths = list(paths)
    files = model_files(paths)
    if not files:
        raise ModelLoadError(f"{repo} has no GGUF model file", code="no_gguf")
    wanted = [tag.upper()] if tag else list(DEFAULT_TAGS)
    first = next((f for t in wanted for f in files if f.tag == t and f.index == 1), None)
    if first is None and tag is None:
        first = next((f for f in files if f.index == 1), None)
    if first is None:
        tags = quant_tags(paths)
        listed = ", ".join(tags) if tags else "none (no file name carries a tag)"
        raise ModelLoadError(f"{repo} has no GGUF file with quant tag {tag}; its tags: {listed}", code="no_such_quant")
    shards = {f.index: f.path for f in files if f.prefix == first.prefix and f.count == first.count}
    missing = [i for i in range(1, first.count + 1) if i not in shards]
    if missing:
        raise ModelLoadError(f"{repo}: {first.path} is split in {first.count} files but shard {missing[0]} "
                             f"of {first.count} is not in the repo", code="missing_shard")
    return [shards[i] for i in range(1, first.count + 1)]


def select_mmproj(paths: Iterable[str], tag: str | None) -> str | None:
    """The vision projector file among a repo's ``paths`` to fetch beside the model of quant tag ``tag``.

    Args:
        paths: the repo's file paths.
        tag: the chosen model file's quant tag (any case), or None.

    Returns:
        The ``mmproj`` GGUF file whose tag is ``tag``, else the first of :data:`MMPROJ_TAGS` present, else
        the first by name; None when the repo has none (split projectors are not taken).
    """
    found = [parse_gguf_name(path) for path in sorted(paths) if "mmproj" in PurePosixPath(path).name.lower()]
    projectors = [name for name in found if name is not None and name.count == 1]
    if not projectors:
        return None
    for wanted in ([tag.upper()] if tag else []) + list(MMPROJ_TAGS):
        match = next((name for name in projectors if name.tag == wanted), None)
        if match is not None:
            return match.path
    return projectors[0].path
