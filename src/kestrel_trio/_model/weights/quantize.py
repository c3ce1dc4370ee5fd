"""int8 and int4 weights quantized from a float checkpoint at load (``weights="int8"`` / ``"int4"``).

Schemes (both symmetric, both chosen for how fast numpy expands them):

* int8: one float32 scale per output channel (row), ``scale = max|w_row| / 127``,
  ``q = round(w / scale)`` in -127..127. One scale per row lets a product
  multiply the integers and scale its columns afterwards, so a chunk's
  expansion is a single int8 -> float32 cast (kestrel_trio._model.products.matmul).
* int4: one float16 scale per group of ``INT4_GROUP`` weights along a row,
  ``scale = max|w_group| / 7``, ``q = round(w / scale)`` in -7..7 (per-row int4
  loses too much; groups of 64 cost 0.53 bytes a weight). Stored as
  :class:`~kestrel_trio._model.forms.packed.Int4Rows`.

Vectors (norms, biases, MoE routers) stay float32. The quantized arrays can be
kept in an on-disk cache (kestrel_trio._model.weights.quant_cache) so that the next
load maps them instead of quantizing again; :class:`QuantizingSource` makes
the weights either way, one tensor at a time (temporaries of one tensor's rows,
a chunk at a time).
"""

from __future__ import annotations

import logging
from typing import Callable

import numpy as np

from kestrel_trio._model.forms.packed import INT4_GROUP, Int4Rows, Int8Rows, PackedMatrix, Rows
from kestrel_trio._model.checkpoints.safetensors import bf16_to_fp32
from kestrel_trio._model.weights.assemble import CheckpointReader, DenseMLP, stacked_vectors

log = logging.getLogger(__name__)

__all__ = ["QUANTIZED_FORMS", "quantize_int8", "quantize_int4", "int4_group", "QuantizingSource"]

QUANTIZED_FORMS = ("int8", "int4")
_ROWS_PER_STEP_WEIGHTS = 1 << 20  # weights quantized per step: temporaries of a few MiB


class _FloatRows:
    """Row slices of a stored matrix as float32: mapped fp32 as is, mapped bf16 bits upcast per slice."""

    def __init__(self, array: np.ndarray, bf16_bits: bool) -> None:
        self.array = array  # [rows, cols] float32, or uint16 bf16 bits
        self.bf16_bits = bf16_bits
        self.shape = array.shape

    def __getitem__(self, rows: slice) -> np.ndarray:
        part = self.array[rows]
        if self.bf16_bits:
            return bf16_to_fp32(part.reshape(-1)).reshape(part.shape)  # [r, cols]
        return np.asarray(part, dtype=np.float32)


def _steps(rows: int, cols: int) -> range:
    return range(0, rows, max(1, _ROWS_PER_STEP_WEIGHTS // max(cols, 1)))


def quantize_int8(weights) -> dict[str, np.ndarray]:
    """``weights`` float32 [rows, cols] (or row slices of it) as int8 ``q`` [rows, cols] and float32 ``scale`` [rows]."""
    rows, cols = weights.shape
    q = np.empty((rows, cols), dtype=np.int8)  # [rows, cols]
    scale = np.empty(rows, dtype=np.float32)  # [rows]
    step = max(1, _ROWS_PER_STEP_WEIGHTS // cols)
    for start in _steps(rows, cols):
        block = weights[start : start + step]  # [r, cols] float32
        s = np.abs(block).max(axis=1) / np.float32(127)  # [r]
        inverse = np.divide(np.float32(1), s, out=np.zeros_like(s), where=s > 0)  # [r]; an all-zero row stays zero
        q[start : start + block.shape[0]] = np.clip(np.rint(block * inverse[:, None]), -127, 127)
        scale[start : start + block.shape[0]] = s
    return {"q": q, "scale": scale}


def int4_group(cols: int) -> int | None:
    """The int4 group size for rows of ``cols`` weights: INT4_GROUP, or a smaller power of two dividing it.

    None when ``cols`` is odd (two weights share a byte): such a matrix is kept in int8.
    """
    if cols % 2:
        return None
    group = INT4_GROUP
    while cols % group:
        group //= 2
    return group


def quantize_int4(weights, group: int) -> dict[str, np.ndarray]:
    """``weights`` float32 [rows, cols] as packed nibbles ``q`` uint8 [rows, cols/2] and float16 ``scale`` [rows, cols/group]."""
    rows, cols = weights.shape
    half = cols // 2
    packed = np.empty((rows, half), dtype=np.uint8)  # [rows, cols/2]
    scale = np.empty((rows, cols // group), dtype=np.float16)  # [rows, groups]
    step = max(1, _ROWS_PER_STEP_WEIGHTS // cols)
    for start in _steps(rows, cols):
        block = np.asarray(weights[start : start + step], dtype=np.float32)  # [r, cols]
        r = block.shape[0]
        grouped = block.reshape(r, cols // group, group)  # [r, groups, group]
        s16 = np.minimum(np.abs(grouped).max(axis=-1) / np.float32(7), np.float32(65504)).astype(np.float16)  # [r, groups]
        s = s16.astype(np.float32)  # the scale the weights are rebuilt with: quantize against it
        inverse = np.divide(np.float32(1), s, out=np.zeros_like(s), where=s > 0)  # [r, groups]
        q = np.clip(np.rint(grouped * inverse[:, :, None]), -7, 7).astype(np.int8).reshape(r, cols)  # [r, cols]
        nibbles = q.view(np.uint8) & np.uint8(0x0F)  # 4-bit two's complement
        packed[start : start + r] = nibbles[:, :half] | (nibbles[:, half:] << np.uint8(4))
        scale[start : start + r] = s16
    return {"q": packed, "scale": scale}


def rows_from_arrays(form: str, arrays: dict[str, np.ndarray]) -> Rows:
    """The packed part stored as ``arrays`` (what :func:`quantize_int8` / :func:`quantize_int4` return)."""
    q, scale = arrays["q"], arrays["scale"]
    if q.dtype == np.int8:
        return Int8Rows(q, scale)
    return Int4Rows(q, scale, (2 * q.shape[1]) // scale.shape[1])


class QuantizingSource:
    """int8/int4 matrices for the weights assembler, from a checkpoint or from arrays mapped from the cache.

    Args:
        reader: the checked checkpoint.
        form: "int8" or "int4".
        stored: quantized arrays by ``"{tensor}:{q|scale}"`` (mapped from the
            cache file); None to quantize from the checkpoint.
        rename: a Qwen3 tensor name as the checkpoint spells it.

    Attributes:
        made: the arrays quantized so far, by the same keys (for writing the cache).
    """

    def __init__(self, reader: CheckpointReader, form: str, stored: dict[str, np.ndarray] | None = None,
                 rename: Callable[[str], str] = lambda name: name) -> None:
        self.reader = reader
        self.form = form
        self.stored = stored
        self.rename = rename
        self.made: dict[str, np.ndarray] = {}

    def vector(self, name: str) -> np.ndarray:
        return self.reader.read(self.rename(name))

    def matrix(self, name: str) -> PackedMatrix:
        return PackedMatrix((self._part(name, lambda: self._float_rows(name)),))

    def stacked(self, parts: list[tuple[str, int]], *tail: int):
        if not tail:  # biases are small: plain float32
            return stacked_vectors(self.vector, parts)
        rows = [self._part(name, lambda name=name: self._float_rows(name)) for name, _ in parts]
        return PackedMatrix(tuple(rows)), [PackedMatrix((r,)) for r in rows]

    def fused_experts(self, gate_up_name: str, down_name: str, count: int) -> tuple[DenseMLP, ...]:
        """The experts of transformers' fused layout ([n_experts, ...] tensors), quantized expert by expert."""
        tensors: dict[str, _FloatRows] = {}

        def expert_rows(name: str, j: int) -> _FloatRows:
            if name not in tensors:
                tensors[name] = self._float_rows(name)  # [n_experts, rows, cols], read (mapped) once
            whole = tensors[name]
            return _FloatRows(whole.array[j], whole.bf16_bits)  # [rows, cols]

        experts = []
        for j in range(count):
            gate_up = self._part(f"{gate_up_name}#{j}", lambda: expert_rows(gate_up_name, j))  # [2*inter, hidden]
            down = self._part(f"{down_name}#{j}", lambda: expert_rows(down_name, j))  # [hidden, inter]
            inter = gate_up.rows // 2
            experts.append(DenseMLP(gate_proj=PackedMatrix((gate_up.select(slice(0, inter)),)),
                                    up_proj=PackedMatrix((gate_up.select(slice(inter, 2 * inter)),)),
                                    down_proj=PackedMatrix((down,)), gate_up_proj=PackedMatrix((gate_up,))))
        return tuple(experts)

    def _part(self, key: str, float_rows: Callable[[], "_FloatRows"]) -> Rows:
        """The part stored under ``key``: mapped from the cache, or quantized from ``float_rows()`` now."""
        if self.stored is not None:
            return rows_from_arrays(self.form, {k: self.stored[f"{key}:{k}"] for k in ("q", "scale")})
        weights = float_rows()
        group = int4_group(weights.shape[1]) if self.form == "int4" else None
        arrays = quantize_int4(weights, group) if group is not None else quantize_int8(weights)
        for k, array in arrays.items():
            array.flags.writeable = False
            self.made[f"{key}:{k}"] = array
        return rows_from_arrays(self.form, arrays)

    def _float_rows(self, name: str) -> _FloatRows:
        """Stored matrix ``name`` as float32 row slices: mapped bf16 bits or fp32 when stored so."""
        stored = self.rename(name)
        if self.reader.checkpoint.tensors[stored].dtype == "BF16":
            return _FloatRows(self.reader.read_bf16(stored), True)
        return _FloatRows(self.reader.read(stored), False)
