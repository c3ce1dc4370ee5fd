"""Confinement of the files a model folder names: each must resolve inside the folder.

A checkpoint folder is input from whoever made it: a ``chat_template.jinja``
that is a symlink to ``/etc/passwd`` would otherwise be read at load and served
back to any client through ``/tokenize``; an index may name ``../../x``. Every
file the loaders open from a folder goes through :func:`confined` (one rule,
one message), and :func:`check_folder_files` refuses the known file names up
front, those no loader reads today included.

A Hugging Face cache snapshot (``<cache>/models--owner--name/snapshots/<rev>/``)
holds symlinks to ``../../blobs/<hash>``: there the repo's cache folder is the
bound, so such snapshots keep loading. So does a folder that ``huggingface-cli download --local-dir`` filled
with links into a cache's blobs (its default before huggingface_hub 0.23): a target that really lies in a
``models--*/blobs/`` folder is a file some hub download put there, never an arbitrary file of the machine's.
"""

from __future__ import annotations

from pathlib import Path

from kestrel_trio.errors import ModelLoadError

# Every file a model folder may name by convention (read or not): a symlink out of the folder is refused for each.
MODEL_FOLDER_FILES = (
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "chat_template.jinja", "chat_template.json", "preprocessor_config.json", "video_preprocessor_config.json",
    "model.safetensors", "model.safetensors.index.json", "added_tokens.json", "vocab.json", "merges.txt",
)


def folder_bound(folder: Path) -> Path:
    """The folder a model folder's files must resolve inside: itself, or its hub cache repo for a snapshot."""
    root = Path(folder).resolve()
    if root.parent.name == "snapshots":
        return root.parent.parent  # <cache>/models--owner--name: its blobs/ hold the snapshot's bytes
    return root


def confined(folder: Path, name: object, *, named_by: str | None = None) -> Path:
    """``folder / name``, once checked to stay inside :func:`folder_bound` (the file need not exist).

    Args:
        folder: the model folder.
        name: a relative file name from the folder's convention or from a file in it (an index's shard).
        named_by: the file that names ``name`` (e.g. ``model.safetensors.index.json``), for the message.

    Raises:
        ModelLoadError: ``name`` is not a string, is absolute, holds ``..`` or a backslash, or resolves
            (through symlinks) outside the bound; one line naming the file.
    """
    folder = Path(folder)
    prefix = f"{named_by}: " if named_by else ""
    if not isinstance(name, str) or not name or Path(name).is_absolute() or ".." in Path(name).parts \
            or "\\" in name or "\0" in name:
        what = "shard name" if named_by else "file name"
        raise ModelLoadError(f"{prefix}{what} {str(name)[:200]!r} is not a file name inside {folder}")
    root = folder_bound(folder)
    path = folder / name
    try:
        target = path.resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop
        raise ModelLoadError(f"{prefix}{path}: cannot be resolved ({exc})") from None
    if target != root and root not in target.parents and not _is_hub_blob(target):
        label = f"shard {name!r}" if named_by else str(path)
        raise ModelLoadError(f"{prefix}{label} resolves to {target}, outside {root}: "
                             "a model folder's files must stay inside it")
    return path


def _is_hub_blob(target: Path) -> bool:
    """Whether the resolved ``target`` is a blob of a Hugging Face cache repo (``models--o--n/blobs/<hash>``)."""
    return target.parent.name == "blobs" and target.parent.parent.name.startswith("models--")


def check_folder_files(folder: Path) -> None:
    """Refuse a model folder whose conventional files or ``*.safetensors`` resolve outside it.

    Raises:
        ModelLoadError: from :func:`confined`, naming the first such file.
    """
    folder = Path(folder)
    for name in MODEL_FOLDER_FILES:
        confined(folder, name)
    for path in sorted(folder.glob("*.safetensors")):
        confined(folder, path.name)
