"""A GGUF file as a checkpoint of Hugging Face-named tensors, expanded to float32 when read.

:class:`GgufCheckpoint` offers what the safetensors checkpoint offers the
loader (``tensors`` by checkpoint name with their shapes and sizes, ``read``,
``read_into``, ``read_bf16``), so :func:`check_tensors` and
:func:`assemble_resident` load a GGUF as they load a folder. Each checkpoint
tensor is a set of rows of one GGUF tensor (all of it, one expert of a stacked
expert tensor, or q/k rows in transformers' order for ``llama``), and reading
it expands exactly those rows (kestrel_trio._model.dequant).

Residency today: each tensor is expanded once at load into the float32 (or
bf16, ``weights="bf16"``) form that safetensors checkpoints load into.
Keeping the quantized blocks resident and expanding them per product is the
next step; the row-set reads here are its building block.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import attrs
import numpy as np

from kestrel_trio._model.config import ModelConfig
from kestrel_trio._model.dequant import expand_rows
from kestrel_trio._model.gguf_names import EXTRA_TENSORS, gguf_name, hf_name, hf_row_order
from kestrel_trio._model.gguf_reader import GgufFile
from kestrel_trio._model.safetensors import fp32_to_bf16_bits
from kestrel_trio._model.shapes import check_tensors
from kestrel_trio._model.weights import CheckpointReader, Weights, assemble_resident

__all__ = ["GgufTensorRef", "GgufCheckpoint", "load_gguf_weights", "gguf_fp32_bytes"]


@attrs.frozen
class GgufTensorRef:
    """One checkpoint-named tensor of a GGUF file.

    Attributes:
        name: the checkpoint name (``model.layers.0.self_attn.q_proj.weight``).
        gguf_name: the GGUF tensor holding it.
        path: the file.
        dtype: the storage type's name (``Q4_K``).
        shape: its shape (one expert's, for a stacked expert tensor).
        nbytes: bytes of storage it reads.
        expert: its index in a stacked expert tensor, or None.
    """

    name: str
    gguf_name: str
    path: Path
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    expert: int | None = None


class GgufCheckpoint:
    """The decoder tensors of a GGUF file under their checkpoint names.

    Unknown GGUF tensors are kept under their own names, so the shape check
    reports them as unexpected, by name.

    Args:
        gguf: the opened file.
        config: its decoder configuration (heads, for the llama row order; experts).
        architecture: the GGUF architecture (``llama``, ``qwen3`` ...).
    """

    config_source = "the GGUF metadata"

    def __init__(self, gguf: GgufFile, config: ModelConfig, architecture: str) -> None:
        self.gguf = gguf
        self.folder = gguf.path  # named in messages, as a safetensors checkpoint's folder is
        self.config = config
        self.architecture = architecture
        self.tensors: dict[str, GgufTensorRef] = {}
        for t in gguf.tensors.values():
            if t.name in EXTRA_TENSORS:
                continue
            names = hf_name(t.name, t.shape[0] if len(t.shape) == 3 else 0) or [(t.name, None)]
            for name, expert in names:
                shape = t.shape[1:] if expert is not None else t.shape
                nbytes = t.nbytes // t.shape[0] if expert is not None else t.nbytes
                self.tensors[name] = GgufTensorRef(name=name, gguf_name=t.name, path=gguf.path,
                                                   dtype=t.ggml_type.name, shape=shape, nbytes=nbytes, expert=expert)

    def tensor_label(self, name: str) -> str:
        """How messages name checkpoint tensor ``name``: its GGUF tensor first."""
        ref = self.tensors.get(name)
        stored = gguf_name(name) if ref is None else ref.gguf_name
        if ref is not None and ref.expert is not None:
            stored = f"{stored} (expert {ref.expert})"
        return repr(stored) if stored == name else f"{stored!r} ({name})"

    def _expand(self, name: str, out: np.ndarray | None = None) -> np.ndarray:
        """Checkpoint tensor ``name`` expanded to float32 [rows, cols] (a vector: [1, n]), into ``out`` if given.

        Only its own rows are expanded: one expert's of a stacked tensor, in
        transformers' order where the llama converter reordered them.
        """
        ref = self.tensors[name]
        stored = self.gguf.tensors[ref.gguf_name]
        raw = self.gguf.raw_rows(ref.gguf_name)  # [rows, row_bytes], mapped
        if ref.expert is not None:
            per_expert = stored.rows // stored.shape[0]
            raw = raw[ref.expert * per_expert : (ref.expert + 1) * per_expert]  # [rows, row_bytes]
        c = self.config
        order = hf_row_order(self.architecture, name, c.num_attention_heads, c.num_key_value_heads, c.head_dim)
        if order is None:
            return expand_rows(stored.ggml_type, raw, out)
        if len(ref.shape) == 2:
            return expand_rows(stored.ggml_type, raw[order], out)  # a row gather of whole blocks
        values = expand_rows(stored.ggml_type, raw).reshape(1, -1)[:, order]  # [1, n] a bias, reordered
        if out is not None:
            out[...] = values
        return values if out is None else out

    def read(self, name: str) -> np.ndarray:
        """Checkpoint tensor ``name`` as a new read-only float32 array of its shape."""
        out = self._expand(name).reshape(self.tensors[name].shape)  # its shape
        out.flags.writeable = False
        return out

    def read_into(self, name: str, out: np.ndarray) -> None:
        """Expand checkpoint tensor ``name`` into ``out`` (float32, C-contiguous, its size)."""
        ref = self.tensors[name]
        if out.dtype != np.float32 or not out.flags.c_contiguous or out.size != int(np.prod(ref.shape)):
            raise ValueError(f"read_into({name!r}): destination must be contiguous float32 of {ref.shape}")
        self._expand(name, out.reshape(-1, ref.shape[-1]) if len(ref.shape) == 2 else out.reshape(1, -1))

    def read_bf16(self, name: str) -> np.ndarray:
        """Checkpoint tensor ``name`` rounded to bf16 bits (uint16, its shape): expanded, then rounded."""
        bits = fp32_to_bf16_bits(self.read(name)).reshape(self.tensors[name].shape)  # its shape
        bits.flags.writeable = False
        return bits


def load_gguf_weights(gguf: GgufFile, config: ModelConfig, architecture: str,
                      progress: Callable[[float], None] | None = None, residency: str = "fp32") -> Weights:
    """Check every tensor of ``gguf`` against ``config`` and expand them into :class:`Weights`.

    Args:
        gguf: the opened file.
        config: its configuration (:func:`config_from_gguf`).
        architecture: the GGUF architecture.
        progress: called with the fraction of stored bytes expanded so far (0 to 1).
        residency: "fp32" or "bf16" (bf16 rounds each expanded tensor once, with a logged warning).

    Raises:
        ModelLoadError: naming the GGUF tensor at fault.
    """
    checkpoint = GgufCheckpoint(gguf, config, architecture)
    check_tensors(checkpoint, config)
    return assemble_resident(config, CheckpointReader(checkpoint, progress), residency, set(checkpoint.tensors))


def gguf_fp32_bytes(gguf: GgufFile) -> int:
    """Bytes the file's tensors take once expanded to float32."""
    return sum(int(np.prod(t.shape)) * 4 for t in gguf.tensors.values())
