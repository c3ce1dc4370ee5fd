"""A model source checked before anything slow: the folder's config.json or the GGUF file's header, parsed once.

Theory of operation: the command line checks ``--model`` (and ``--draft-model``) in milliseconds, before it binds
a port or reads a weight, and ``serve`` checks a path it is given for the same reason. What that check parsed (the
configuration, a GGUF file's metadata and tensor table, the residency the asked-for ``weights`` resolve to) is
kept in a :class:`CheckedModel`, which ``serve``, the draft's vocabulary check and ``load_model`` take in place of
the path: a GGUF file is parsed once from the command line to the loaded model, and ``weights`` resolved once.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from kestrel_trio._model import (
    GgufFile, ModelConfig, config_from_dict, config_from_gguf, is_gguf_file, is_qwen3_vl, read_config_json,
    resolve_residency, vl_config_from_dict, vl_config_from_gguf,
)
from kestrel_trio.errors import KestrelError, ModelLoadError

__all__ = ["CheckedModel", "check_model", "vl_gguf_pair"]


@attrs.frozen
class CheckedModel:
    """A checkpoint folder or GGUF file that :func:`check_model` accepted, with what it read.

    Attributes:
        path: the folder or file, as given.
        config: the configuration of the language model the loader builds (of a Qwen3-VL checkpoint: its text
            model).
        gguf: the parsed GGUF file (metadata and tensor table; its data memory-mapped, nothing expanded), or None
            for a folder.
        vision: a Qwen3-VL checkpoint folder, or a Qwen3-VL language-model GGUF with its mmproj file (it takes
            images).
        weights: the ``weights`` it was checked for (load_model's argument), or None: not checked.
        residency: what ``weights`` resolved to, or None: to be chosen at load ("auto" for a folder compares the
            weights' sizes with the memory available then; or ``weights`` was not checked).
        mmproj: the mmproj GGUF file (a Qwen3-VL vision tower) checked to fit ``path``, or None.
    """

    path: Path
    config: ModelConfig
    gguf: GgufFile | None = attrs.field(eq=False)
    vision: bool = False
    weights: str | None = None
    residency: str | None = None
    mmproj: Path | None = None

    @property
    def name(self) -> str:
        """The model's name as :func:`kestrel_trio.load_model` gives it: a GGUF file's stem, a folder's own name."""
        return self.path.name.removesuffix(".gguf") if self.gguf is not None else self.path.resolve().name

    def residency_for(self, weights: str) -> str | None:
        """The residency checked for ``weights`` (None: to be resolved at load).

        Raises:
            KestrelError: the model was checked for other ``weights`` than it is now loaded with.
        """
        if self.weights is not None and weights != self.weights:
            raise KestrelError(f"{self.path}: checked for weights={self.weights} but loaded with weights={weights}: "
                               "check it with the weights it loads with")
        return self.residency


def check_model(path: str | Path, *, weights: str | None = None, mmproj: str | Path | None = None) -> CheckedModel:
    """Check, in milliseconds, what :func:`kestrel_trio.load_model` would refuse first, keeping what was read.

    Reads config.json with the loader's own readers (so a field the loader refuses is refused here with the same
    message) and no weights; a ``.gguf`` file gets the same check of its header, metadata and tensor table
    (memory-mapped, nothing expanded).

    Args:
        path: the checkpoint folder or GGUF file.
        weights: load_model's ``weights``, checked against the kind of model (int8/int4 need a folder, gguf a
            GGUF file); None: not checked.
        mmproj: load_model's ``mmproj``: both headers are read and checked to fit each other (no tensor is read).

    Raises:
        ModelLoadError: ``path`` is neither a folder nor a GGUF file, or its config.json is missing, unreadable,
            not JSON, or names a field or architecture the loader refuses (for a GGUF file: its header or
            metadata), or ``weights`` does not apply to it, or ``mmproj`` does not fit ``path``.
    """
    folder = Path(path)
    is_gguf = folder.is_file() and (folder.suffix == ".gguf" or is_gguf_file(folder))
    if mmproj is not None:  # the pair is checked first: a file that is not one fails before weights are resolved
        gguf, tower = vl_gguf_pair(folder, Path(mmproj))
        config = vl_config_from_gguf(gguf, tower).text
        if weights is not None and weights != "auto":
            resolve_residency(None, weights, gguf=True)  # raises when the form does not apply
        # the load resolves the residency of the pair itself (the tower's tensors with the language model's)
        return CheckedModel(folder, config, gguf, vision=True, mmproj=Path(mmproj))
    residency = None
    if weights is not None and (weights != "auto" or is_gguf):  # a folder's auto is chosen at load
        residency = resolve_residency(None, weights, gguf=is_gguf)  # raises when the form does not apply
    if is_gguf:
        gguf = GgufFile(folder)
        return CheckedModel(folder, config_from_gguf(gguf), gguf, weights=weights, residency=residency)
    if not folder.is_dir():
        raise ModelLoadError(f"{folder}: no such checkpoint folder or GGUF file" if not folder.exists()
                             else f"{folder}: not a folder (a checkpoint is a folder with config.json) "
                                  "or a GGUF file")
    raw, config_path = read_config_json(folder)
    vision = is_qwen3_vl(raw)
    config = (vl_config_from_dict(raw, source=str(config_path)).text if vision
              else config_from_dict(raw, source=str(config_path)))
    return CheckedModel(folder, config, None, vision=vision, weights=weights, residency=residency)


def vl_gguf_pair(path: Path, mmproj: Path) -> tuple[GgufFile, GgufFile]:
    """The opened language-model GGUF and mmproj GGUF, or a ModelLoadError saying which is not a GGUF file."""
    if not (path.is_file() and is_gguf_file(path)):
        raise ModelLoadError(f"{path}: an mmproj file goes with a GGUF language model file, and this is "
                             + ("a folder (a checkpoint folder holds its vision tower itself)" if path.is_dir()
                                else "not one"))
    if not (mmproj.is_file() and is_gguf_file(mmproj)):
        raise ModelLoadError(f"{mmproj}: the mmproj file is not a GGUF file" if mmproj.exists()
                             else f"{mmproj}: no such mmproj file")
    return GgufFile(path), GgufFile(mmproj)
