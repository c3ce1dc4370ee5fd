"""A packed matrix's product with more rows than the fused products take (prefill): its rows expanded
chunk by chunk into a thread's scratch buffer, each chunk multiplied as soon as it is ready.

kestrel_trio._model.products.matmul.linear_packed plans the chunks (:func:`chunk_plan`) and shares
them among the product threads, each running :func:`run_chunks` on its own stretch. Chunks gather
rows across the matrix's parts, so that q/k/v or gate/up make one product. A part's integers come
with per-group scales (kestrel_trio._model.forms.dequant.Affine); for a few activation rows
(GROUPED_MAX_ROWS) the scales go on partial sums instead of on the weights (matmul's docstring has
the algebra).
"""

from __future__ import annotations

import threading

import numpy as np

from kestrel_trio import _kernels
from kestrel_trio._model.forms.dequant import Affine, apply_affine
from kestrel_trio._model.forms.packed import PackedMatrix, Rows, grouped_integers, scratch_width
from kestrel_trio._model.products.float_calls import product_into

__all__ = ["Chunk", "Inputs", "chunk_plan", "run_chunks", "GROUPED_MAX_ROWS"]

# Rows up to which grouped scales are applied to partial sums rather than to the weights (matmul's docstring),
# for groups of 32 weights; in proportion for other sizes (Q6_K's 16: half; int4's 64: twice). Measured on one
# core, 256 x 1024 weights hot: Q8_0 at 4 rows 101 us that way against 132 us expanded, at 8 rows 162 against
# 139; Q4_K about even at 8 rows (258 against 263); Q6_K already even at 4 rows.
GROUPED_MAX_ROWS = 6
_scratch = threading.local()  # one buffer per thread: forward may run in several threads

# One chunk: the result columns it fills and the (part, first row, rows) runs that make it.
Chunk = tuple[int, tuple[tuple[Rows, int, int], ...]]


def chunk_plan(weight: PackedMatrix, chunk_rows: int) -> list[Chunk]:
    """``weight``'s rows in chunks of ``chunk_rows`` (the last may be shorter), gathered across its parts in order."""
    chunks, runs, filled, done = [], [], 0, 0
    for part in weight.parts:
        start = 0
        while start < part.rows:
            take = min(part.rows - start, chunk_rows - filled)
            runs.append((part, start, take))
            filled, start = filled + take, start + take
            if filled == chunk_rows:
                chunks.append((done, tuple(runs)))
                runs, done, filled = [], done + filled, 0
    if filled:
        chunks.append((done, tuple(runs)))
    return chunks


class Inputs:
    """The activations of one product, and their per-group layouts, made once and shared by the chunks."""

    def __init__(self, x: np.ndarray) -> None:
        self.x = x  # [N, in]
        self._by_group: dict[int, np.ndarray] = {}
        self._sums: dict[int, np.ndarray] = {}

    def grouped(self, part: Rows) -> bool:
        """Whether ``part``'s group scales go on partial sums (True), not on the weights before the product."""
        return part.scaling == "group" and self.x.shape[0] * 32 <= GROUPED_MAX_ROWS * part.group

    def by_group(self, group: int) -> np.ndarray:
        """x as [in/group, group, N], each group's activations as a matrix (threads may both make it: harmless)."""
        found = self._by_group.get(group)
        if found is None:
            n, width = self.x.shape
            found = np.ascontiguousarray(self.x.reshape(n, width // group, group).transpose(1, 2, 0))
            self._by_group[group] = found  # [in/group, group, N]
        return found

    def sums(self, group: int) -> np.ndarray:
        """Each group's sum of activations, [N, in/group]."""
        found = self._sums.get(group)
        if found is None:
            n, width = self.x.shape
            found = self._sums[group] = self.x.reshape(n, width // group, group).sum(axis=-1)  # [N, in/group]
        return found


def run_chunks(inputs: Inputs, chunks: list[Chunk], out: np.ndarray, call: str) -> None:
    """Expand and multiply ``chunks`` in this thread's scratch buffers, into their columns of ``out``, each
    product in ``call`` (:func:`_product_into`).

    Runs whose group scales go on partial sums are multiplied one by one as
    they come. The others are expanded side by side into one buffer, so that
    consecutive ones (q/k/v, gate/up) make one product; a part with one scale
    per row leaves its integers unscaled there, and its output columns are
    scaled once all chunks are done, one call per stretch of the part.
    """
    x = inputs.x
    width = x.shape[1]
    rows = max(sum(take for _, _, take in runs) for _, runs in chunks)
    buffer = _scratch_buffer(rows * width).reshape(rows, width)  # [rows, in]
    row_scaled: list[list] = []  # [first column, part, first row, rows]: columns still to scale
    for done, runs in chunks:
        column, filled, span = done, 0, done  # span: the output column of buffer row 0
        for part, start, take in runs:
            compiled = _kernels.compiled(part.form)
            if inputs.grouped(part) and not compiled:
                if filled:
                    product_into(x, buffer[:filled], out[:, span : span + filled], call)
                    filled = 0
                scratch = _scratch_buffer(take * scratch_width(part), "grouped")
                values, affine = grouped_integers(part, start, start + take, scratch)  # [take, groups, group]
                _grouped_into(inputs, values, affine, out[:, column : column + take])
            else:
                if not filled:
                    span = column
                target = buffer[filled : filled + take]  # [take, in]
                if compiled:  # the weights themselves, in one compiled pass (numpy's takes several)
                    _kernels.packed_expand(*part.kernel_args(), start, start + take, target)
                elif part.scaling == "row":
                    part.integer(start, start + take, target)
                    _defer_row_scales(row_scaled, column, part, start, take)
                else:
                    apply_affine(part.integer(start, start + take, target), target)
                filled += take
            column += take
        if filled:
            product_into(x, buffer[:filled], out[:, span : span + filled], call)
    for first, part, start, take in row_scaled:
        columns = out[:, first : first + take]  # [N, take]
        columns *= part.scale[start : start + take]


def _defer_row_scales(pending: list[list], column: int, part: Rows, start: int, take: int) -> None:
    """Note columns [column, column+take) to scale by ``part``'s rows [start, start+take), merging stretches."""
    if pending:
        last = pending[-1]
        if last[1] is part and last[0] + last[3] == column and last[2] + last[3] == start:
            last[3] += take
            return
    pending.append([column, part, start, take])


def _grouped_into(inputs: Inputs, values: np.ndarray, affine: Affine, out: np.ndarray) -> None:
    """``out`` [N, rows] = x @ (scale * q + offset).T with the scales applied to partial sums.

    ``values`` [rows, groups, group] holds the integers of ``rows`` weight rows
    (a strided view is fine), ``affine`` their groups' scales.
    """
    group = values.shape[2]
    partial = np.matmul(values.transpose(1, 0, 2), inputs.by_group(group))  # [groups, rows, N]
    partial *= affine.scale.T[:, :, None]
    # A multiply and a reduction, not einsum: einsum keeps the GIL, and these run in the product threads.
    np.sum(partial, axis=0, out=out.T)  # [rows, N]
    if affine.offset is not None:
        out += inputs.sums(group) @ affine.offset.T  # [N, groups] @ [groups, rows]


def _scratch_buffer(size: int, slot: str = "buffer") -> np.ndarray:
    """This thread's float32 scratch ``slot`` of at least ``size`` elements, grown never shrunk."""
    buffer = getattr(_scratch, slot, None)
    if buffer is None or buffer.size < size:
        buffer = np.empty(size, dtype=np.float32)  # [size]
        setattr(_scratch, slot, buffer)
    return buffer[:size]

