"""Checks in milliseconds, before any weight is read: a model folder or file, a context cap, a draft's vocabulary.

What :func:`~kestrel_trio.model.loading.load_model` would refuse first, refused before anything slow or visible
(binding a port, reading weights, compiling kernels), with the loader's own readers and messages.
"""

from __future__ import annotations

import json
from pathlib import Path

from kestrel_trio._model import GgufFile, ModelConfig, is_gguf_file, is_qwen3_vl
from kestrel_trio.model.checked import CheckedModel, check_model
from kestrel_trio.errors import ModelLoadError
from kestrel_trio.model.loaded import DEMO_CONFIG, DEMO_MODEL_ID, Model, _check_context_cap
from kestrel_trio.text import Tokenizer

__all__ = ["check_model_folder", "check_context_cap", "check_draft_model", "is_qwen3_vl_folder",
           "is_vl_language_gguf"]


def check_model_folder(path: str | Path, *, weights: str | None = None, mmproj: str | Path | None = None
                       ) -> ModelConfig:
    """Check, in milliseconds, what :func:`load_model` would refuse first: the folder and its config.json.

    Reads config.json with the loader's own readers (so a field the loader
    refuses is refused here with the same message) and no weights; run it
    before anything slow or visible, e.g. binding a port. A ``.gguf`` file gets
    the same check of its header, metadata and tensor table (memory-mapped,
    nothing expanded).

    Args:
        path: the checkpoint folder or GGUF file.
        weights: load_model's ``weights``, checked against the kind of model
            (int8/int4 need a folder, gguf a GGUF file); None: not checked.
        mmproj: load_model's ``mmproj``: both headers are read and checked to fit
            each other (no tensor is read).

    Returns:
        The configuration of the language model the loader would build (of a
        Qwen3-VL checkpoint: its text model), for further checks against it.

    Raises:
        ModelLoadError: ``path`` is neither a folder nor a GGUF file, or its
            config.json is missing, unreadable, not JSON, or names a field or
            architecture the loader refuses (for a GGUF file: its header or
            metadata), or ``weights`` does not apply to it.

    :func:`check_model` checks the same and keeps what it parsed, for the load.
    """
    return check_model(path, weights=weights, mmproj=mmproj).config


def check_context_cap(model: Model | CheckedModel | str | Path | None, max_model_len: int | None, *,
                      config: ModelConfig | None = None) -> None:
    """Refuse a context cap (``max_model_len``, tokens) longer than the model's context, from its config alone.

    What :meth:`Model.with_context_length` would refuse once the weights are
    loaded, checked in milliseconds before (no weights read), so a server
    fails before it binds, loads or compiles anything.

    Args:
        model: a loaded Model, a checked model, a checkpoint folder or GGUF file, or None for the built-in demo
            model.
        max_model_len: the cap; None: none asked for, nothing to check.
        config: the configuration :func:`check_model_folder` returned for ``model``
            (None: read it again).

    Raises:
        KestrelError: ``max_model_len`` is below 1 or above the model's context.
    """
    if max_model_len is None:
        return
    if isinstance(model, Model):
        model.with_context_length(max_model_len)
        return
    if model is None:
        context, name = DEMO_CONFIG["max_position_embeddings"], DEMO_MODEL_ID
    elif isinstance(model, CheckedModel):
        context, name = model.config.max_position_embeddings, model.name
    else:
        path = Path(model)
        context = (config or check_model_folder(path)).max_position_embeddings
        name = path.name.removesuffix(".gguf") if path.is_file() else path.resolve().name  # as load_model names it
    _check_context_cap(max_model_len, context, name)


def check_draft_model(target: Model | CheckedModel | str | Path | None, draft: Model | CheckedModel | str | Path
                      ) -> None:
    """Check that ``draft`` can draft for ``target`` (speculative decoding): the same vocabulary, id for id.

    Reads only the tokenizers (a folder's tokenizer.json, a GGUF file's metadata: a checked GGUF file's as
    parsed), so it runs before any weights load.

    Args:
        target: the served model, its checked model or checkpoint path, or None for the built-in demo model.
        draft: the draft model, its checked model or its checkpoint path.

    Raises:
        ModelLoadError: either has no tokenizer, or their vocabularies differ (the message says where).
    """
    ours, theirs = _vocabulary_of(target), _vocabulary_of(draft)
    name = draft.name if isinstance(draft, Model) else _path_of(draft).name
    if len(ours) != len(theirs):
        raise ModelLoadError(f"draft model {name}: its tokenizer has {len(theirs)} tokens, the served model's "
                             f"{len(ours)}: a draft model must share the served model's vocabulary")
    differ = sorted(token_id for token, token_id in theirs.items() if ours.get(token) != token_id)
    if differ:
        first = differ[0]
        raise ModelLoadError(f"draft model {name}: {len(differ)} token ids differ from the served model's "
                             f"vocabulary (the first: id {first}): a draft model must share its tokenizer")


def _path_of(model: CheckedModel | str | Path) -> Path:
    return model.path if isinstance(model, CheckedModel) else Path(model)


def _vocabulary_of(model: Model | CheckedModel | str | Path | None) -> dict[str, int]:
    """A model's vocabulary (entry -> id) from its tokenizer alone; ModelLoadError when it has none."""
    if model is None:
        return Tokenizer.from_demo().vocabulary()
    if isinstance(model, Model):
        tokenizer = model.tokenizer
    else:
        path = _path_of(model)
        if path.is_file():
            gguf = model.gguf if isinstance(model, CheckedModel) and model.gguf is not None else GgufFile(path)
            metadata = gguf.metadata
            tokenizer = Tokenizer.from_gguf(metadata, path.name) if "tokenizer.ggml.tokens" in metadata else None
        else:
            tokenizer = Tokenizer.from_folder(path) if (path / "tokenizer.json").is_file() else None
    if tokenizer is None:
        name = model.name if isinstance(model, Model) else _path_of(model).name
        raise ModelLoadError(f"{name} has no tokenizer: a draft model and the served model must both have one, "
                             "to check that they share a vocabulary")
    return tokenizer.vocabulary()


def is_qwen3_vl_folder(folder: Path) -> bool:
    """Whether ``folder/config.json`` names Qwen3-VL (False when it is missing or unreadable)."""
    try:
        raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False  # read_config reports what is wrong with the file
    return isinstance(raw, dict) and is_qwen3_vl(raw)

def is_vl_language_gguf(path: str | Path) -> bool:
    """Whether ``path`` is a GGUF file of a Qwen3-VL language model (architecture ``qwen3vl``), which an
    mmproj file completes; reads the header only."""
    path = Path(path)
    return path.is_file() and is_gguf_file(path) and GgufFile(path).metadata.get("general.architecture") == "qwen3vl"
