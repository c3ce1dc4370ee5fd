"""A GGUF file as a checkpoint of Hugging Face-named tensors, expanded to float32 when read.

:class:`GgufCheckpoint` offers what the safetensors checkpoint offers the
loader (``tensors`` by checkpoint name with their shapes and sizes, ``read``,
``read_into``, ``read_bf16``), so :func:`check_tensors` and
:func:`assemble_resident` load a GGUF as they load a folder. Each checkpoint
tensor is a set of rows of one GGUF tensor (all of it, one expert of a stacked
expert tensor, or q/k rows in transformers' order for ``llama``), and reading
it expands exactly those rows (kestrel_trio._model.forms.dequant).

Residency: ``weights="gguf"`` keeps every matrix as the file stores it
(:meth:`GgufCheckpoint.stored_rows`: ggml blocks, a view of the mapped file;
an F32 matrix read whole by every step is copied into an array, which numpy
puts in huge pages), expanded a chunk at a time
by each product; only vectors (norms, biases, MoE routers) are expanded at
load. ``fp32`` and ``bf16`` expand each tensor once at load into the forms
safetensors checkpoints load into.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import attrs
import numpy as np

from kestrel_trio._model.checkpoints.config import ModelConfig
from kestrel_trio._model.forms.dequant import expand_rows
from kestrel_trio._model.gguf.names import EXTRA_TENSORS, gguf_name, hf_name, hf_row_order
from kestrel_trio._model.gguf.reader import GgufFile
from kestrel_trio._model.forms.packed import GgmlRows, Matrix, PackedMatrix
from kestrel_trio._model.weights.residency import GGUF_RESIDENCIES, assemble_resident
from kestrel_trio._model.weights.resident import is_mapped
from kestrel_trio._model.checkpoints.safetensors import fp32_to_bf16_bits
from kestrel_trio._model.checkpoints.shapes import check_tensors
from kestrel_trio._model.weights.assemble import (
    CheckpointReader, DenseMLP, Weights, assemble_from, fused_rows, own_copy, row_tables, stacked_vectors,
)
from kestrel_trio.errors import ModelLoadError

__all__ = ["GgufTensorRef", "GgufCheckpoint", "load_gguf_weights"]


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

    def stored_rows(self, name: str) -> GgmlRows:
        """Checkpoint tensor ``name`` as stored: its ggml blocks, uint8 [rows, row_bytes] (a vector: one row).

        A view of the mapped file (one expert's rows of a stacked tensor are a
        row range of it); for the llama architecture's q/k matrices, whose rows
        the converter reordered, a copy of the blocks in transformers' order (a
        row gather: still quantized). A reordered bias's elements are put back
        in order only when expanded (:meth:`read`).
        """
        ref = self.tensors[name]
        stored = self.gguf.tensors[ref.gguf_name]
        raw = self.gguf.raw_rows(ref.gguf_name)  # [rows, row_bytes], mapped
        if ref.expert is not None:
            per_expert = stored.rows // stored.shape[0]
            raw = raw[ref.expert * per_expert : (ref.expert + 1) * per_expert]  # [rows, row_bytes]
        order = self._order(name)
        if order is not None and len(ref.shape) == 2:
            raw = raw[order]  # [rows, row_bytes] whole blocks, gathered
            raw.flags.writeable = False
        return GgmlRows(stored.ggml_type, raw)

    def _order(self, name: str) -> np.ndarray | None:
        c = self.config
        return hf_row_order(self.architecture, name, c.num_attention_heads, c.num_key_value_heads, c.head_dim)

    def _expand(self, name: str, out: np.ndarray | None = None) -> np.ndarray:
        """Checkpoint tensor ``name`` expanded to float32 [rows, cols] (a vector: [1, n]), into ``out`` if given.

        Only its own rows are expanded: one expert's of a stacked tensor, in
        transformers' order where the llama converter reordered them.
        """
        rows = self.stored_rows(name)
        order = self._order(name)
        if order is None or len(self.tensors[name].shape) == 2:
            return expand_rows(rows.ggml_type, rows.data, out)
        values = expand_rows(rows.ggml_type, rows.data).reshape(1, -1)[:, order]  # [1, n] a bias, reordered
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


class _StoredSource:
    """The weights assembler's matrices for ``weights="gguf"``: each tensor as stored, never expanded at load."""

    def __init__(self, reader: CheckpointReader, tied_embeddings: bool) -> None:
        self.reader = reader
        self.checkpoint: GgufCheckpoint = reader.checkpoint
        self.vector = reader.read  # norms, biases, routers: small, float32
        self._row_tables = row_tables(tied_embeddings)

    def _rows(self, name: str) -> GgmlRows:
        rows = self.checkpoint.stored_rows(name)
        self.reader.advance(name)
        return rows

    def matrix(self, name: str) -> Matrix:
        rows = self._rows(name)
        if rows.form == "F32" and rows.data.flags.c_contiguous:
            stored = rows.data.view("<f4")  # [rows, cols] float32: nothing to expand
            return stored if self._read_by_rows(name) or not is_mapped(stored) else own_copy(stored)
        return PackedMatrix((rows,))

    def _read_by_rows(self, name: str) -> bool:
        """Whether a step reads only some rows of ``name`` (an untied embedding, an expert): it stays mapped.

        Every other float32 matrix is read whole at every step, and gets an array of its own, in huge pages
        where the page cache's are 4 KiB (kestrel_trio._model.weights.assemble: :func:`own_copy`). Measured on the
        2-core Zen 5, Qwen3-0.6B's shapes in an F32 GGUF, batch-1 decode steps, processes alternated with
        the same weights' safetensors (fp32 residency), medians of 30: o/down mapped and q/k/v, gate/up as
        packed F32 parts, 77-90 ms against 62-77; as arrays, 46-61 ms against 56-61.
        """
        return name in self._row_tables or ".mlp.experts." in name

    def stacked(self, parts: list[tuple[str, int]], *tail: int):
        if not tail:  # biases are small: plain float32
            return stacked_vectors(self.vector, parts)
        rows = [self._rows(name) for name, _ in parts]
        if all(r.form == "F32" for r in rows) and not any(self._read_by_rows(name) for name, _ in parts):
            # float32 already: one fused array, as fp32 residency makes, so a product is one BLAS call (or the
            # small-batch call) on huge pages rather than one packed product per part
            stored = [r.data.view("<f4") for r in rows]  # [rows_i, cols] each
            return fused_rows([(a.shape[0], lambda out, a=a: np.copyto(out, a)) for a in stored], *tail)
        return PackedMatrix(tuple(rows)), [PackedMatrix((r,)) for r in rows]

    def fused_experts(self, gate_up_name: str, down_name: str, count: int) -> tuple[DenseMLP, ...]:
        raise AssertionError("a GGUF's experts are per-expert checkpoint tensors, never the fused layout")


def load_gguf_weights(gguf: GgufFile, config: ModelConfig, architecture: str,
                      progress: Callable[[float], None] | None = None, residency: str = "gguf") -> Weights:
    """Check every tensor of ``gguf`` against ``config`` and assemble them into :class:`Weights`.

    Args:
        gguf: the opened file.
        config: its configuration (:func:`config_from_gguf`).
        architecture: the GGUF architecture.
        progress: called with the fraction of stored bytes read or mapped so far (0 to 1).
        residency: "gguf" (matrices stay as stored, memory-mapped, expanded at
            each use), "fp32" (expanded once at load) or "bf16" (expanded,
            then rounded once, with a logged warning).

    Raises:
        ModelLoadError: naming the GGUF tensor at fault.
    """
    if residency not in GGUF_RESIDENCIES:
        raise ModelLoadError(f"a GGUF file's weights residency must be one of {', '.join(GGUF_RESIDENCIES)}, "
                             f"got {residency!r}")
    checkpoint = GgufCheckpoint(gguf, config, architecture)
    check_tensors(checkpoint, config)
    reader = CheckpointReader(checkpoint, progress)
    if residency == "gguf":
        return assemble_from(config, set(checkpoint.tensors), _StoredSource(reader, config.tie_word_embeddings))
    return assemble_resident(config, reader, residency, set(checkpoint.tensors))
