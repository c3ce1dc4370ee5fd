"""Matrices held in a compact form and expanded to float32 only a chunk at a time, at each use.

A :class:`PackedMatrix` [out, in] is its rows in one or more *parts*, each a
run of rows in one storage form (q/k/v or gate/up stay separate parts of one
fused matrix, each possibly of its own form, uncopied). Every part knows one
thing: how to write the integers of any of its rows into a float32 buffer,
with the per-group scales and offsets that make them weights
(:meth:`integer`, returning a :class:`~kestrel_trio._model.forms.dequant.Affine`,
or None when the written values are the weights themselves). The products
(:func:`kestrel_trio._model.products.matmul.linear`) expand cache-sized chunks of rows
that way just in time, and an embedding lookup expands only the rows looked up
(:meth:`PackedMatrix.rows`). Nothing is ever expanded whole, except by
:meth:`PackedMatrix.dense`, which exists for tests and tools.

Storage forms (bytes per weight):

* :class:`Bf16Rows` (2): bf16 bits, ``weights="bf16"``; exact upcast.
* :class:`GgmlRows` (4 to 0.56): a GGUF tensor's blocks as stored, memory-mapped
  from the file, ``weights="gguf"``; expanded bit for bit as ggml does
  (kestrel_trio._model.forms.dequant).
* :class:`Int8Rows` (1 + 4 per row): ``weights="int8"``, symmetric per output
  channel (row): ``w = scale[row] * q``, q in -127..127.
* :class:`Int4Rows` (0.5 + 2 per group): ``weights="int4"``, symmetric per
  group of INT4_GROUP weights along a row: ``w = scale[group] * q``, q in
  -7..7, scales float16.
"""

from __future__ import annotations

from typing import Protocol, Union

import attrs
import numpy as np

from kestrel_trio._model.forms.dequant import FLOAT_TYPES, Affine, GgmlType, apply_affine, integer_part, q8_0_in_place

__all__ = ["Rows", "PackedMatrix", "Bf16Matrix", "Bf16Rows", "GgmlRows", "Int8Rows", "Int4Rows", "expand_part",
           "grouped_integers", "INT4_GROUP"]

INT4_GROUP = 64  # weights per int4 scale (see docs/memory.md for why 64)


class Rows(Protocol):
    """One part of a :class:`PackedMatrix`: ``rows`` rows of ``cols`` weights in some storage form.

    ``scaling`` says what :meth:`integer` returns: "none" (the values are the
    weights), "row" (one scale per row) or "group" (scales per ``group``
    weights of a row).
    """

    rows: int
    cols: int
    nbytes: int
    form: str
    scaling: str
    group: int

    def integer(self, start: int, stop: int, out: np.ndarray) -> Affine | None:
        """Write rows [start, stop)'s integers into ``out`` (float32 [stop-start, cols], C-contiguous)."""

    def select(self, ids: np.ndarray | slice) -> "Rows":
        """Rows ``ids`` as a part of the same form: a slice is a view of the storage, an index array a copy."""

    def kernel_args(self) -> tuple[str, np.ndarray, np.ndarray | None]:
        """(form, storage, scales) as kestrel_trio._kernels.packed_product takes them (forms it knows)."""


def expand_part(part: Rows, start: int, stop: int, out: np.ndarray) -> np.ndarray:
    """Rows [start, stop) of ``part`` as their float32 weights, written into ``out`` [stop-start, cols]."""
    apply_affine(part.integer(start, stop, out), out)
    return out


def scratch_width(part: Rows) -> int:
    """float32 elements per row that :func:`grouped_integers` may use of its scratch."""
    return max(part.cols, part.data.shape[1]) if isinstance(part, GgmlRows) else part.cols  # Q8_0: its bytes


def grouped_integers(part: Rows, start: int, stop: int, scratch: np.ndarray) -> tuple[np.ndarray, Affine]:
    """Rows [start, stop)'s integers as float32 [rows, groups, group] (a view of ``scratch``, maybe strided).

    For a part whose ``scaling`` is not "none"; ``scratch`` holds at least
    (stop - start) * :func:`scratch_width` elements. The integers need not be
    laid out as a matrix: a product with the scales on partial sums reads each
    group as its own strided matrix.
    """
    if isinstance(part, GgmlRows) and part.ggml_type.name == "Q8_0":
        return q8_0_in_place(part.data[start:stop], scratch)
    values = scratch[: (stop - start) * part.cols].reshape(stop - start, part.cols)  # [rows, cols]
    affine = part.integer(start, stop, values)
    return values.reshape(stop - start, -1, affine.group), affine


@attrs.frozen
class GgmlRows:
    """Rows of a GGUF tensor as stored: ggml blocks, uint8 [rows, row_bytes] (usually a view of the mapped file)."""

    ggml_type: GgmlType
    data: np.ndarray  # uint8 [rows, row_bytes]

    @property
    def rows(self) -> int:
        return self.data.shape[0]

    @property
    def cols(self) -> int:
        return self.data.shape[1] // self.ggml_type.type_size * self.ggml_type.block_size

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    @property
    def form(self) -> str:
        return self.ggml_type.name

    @property
    def scaling(self) -> str:
        return "none" if self.ggml_type.name in FLOAT_TYPES else "group"

    @property
    def group(self) -> int:
        return {"Q6_K": 16}.get(self.ggml_type.name, 32) if self.scaling == "group" else self.cols

    def integer(self, start: int, stop: int, out: np.ndarray) -> Affine | None:
        return integer_part(self.ggml_type, self.data[start:stop], out)

    def select(self, ids: np.ndarray | slice) -> "GgmlRows":
        return GgmlRows(self.ggml_type, self.data[ids])  # [len(ids), row_bytes], whole blocks

    def kernel_args(self) -> tuple[str, np.ndarray, None]:
        return self.ggml_type.name, self.data, None  # [rows, row_bytes]


@attrs.frozen
class Bf16Rows:
    """bf16 bits, uint16 [rows, cols] (memory-mapped when the checkpoint stores bf16)."""

    data: np.ndarray  # uint16 [rows, cols]
    form = "bf16"
    scaling = "none"

    @property
    def rows(self) -> int:
        return self.data.shape[0]

    @property
    def cols(self) -> int:
        return self.data.shape[1]

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    @property
    def group(self) -> int:
        return self.cols

    def integer(self, start: int, stop: int, out: np.ndarray) -> None:
        bits = out.view(np.uint32)  # [take, cols] the same memory
        np.copyto(bits, self.data[start:stop])  # widen; 2x faster here than a casting left_shift
        bits <<= 16  # bf16 is the top half of a float32: exact
        return None

    def select(self, ids: np.ndarray | slice) -> "Bf16Rows":
        return Bf16Rows(self.data[ids])

    def kernel_args(self) -> tuple[str, np.ndarray, None]:
        return "bf16", self.data, None


@attrs.frozen
class Int8Rows:
    """int8 weights with one float32 scale per row: ``w = scale * q``."""

    data: np.ndarray  # int8 [rows, cols]
    scale: np.ndarray  # float32 [rows]
    form = "int8"
    scaling = "row"

    @property
    def rows(self) -> int:
        return self.data.shape[0]

    @property
    def cols(self) -> int:
        return self.data.shape[1]

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + self.scale.nbytes

    @property
    def group(self) -> int:
        return self.cols

    def integer(self, start: int, stop: int, out: np.ndarray) -> Affine:
        np.copyto(out, self.data[start:stop], casting="unsafe")
        return Affine(self.scale[start:stop, None], None, self.cols)  # one group: the row

    def select(self, ids: np.ndarray | slice) -> "Int8Rows":
        return Int8Rows(self.data[ids], self.scale[ids])

    def kernel_args(self) -> tuple[str, np.ndarray, np.ndarray]:
        return "int8", self.data, self.scale[:, None]  # [rows, cols], float32 [rows, 1]


@attrs.frozen
class Int4Rows:
    """4-bit weights with one float16 scale per ``group`` weights of a row: ``w = scale * q``.

    Byte j of a row holds weight j in its low nibble and weight j + cols/2 in
    its high nibble, each 4-bit two's complement. So ``byte << 4`` and
    ``byte & 0xF0``, viewed as int8, are 16 q of the two halves of the row:
    two uint8 operations and one cast write the integers (16 q; the scales
    are divided by 16, exactly).
    """

    data: np.ndarray  # uint8 [rows, cols/2]
    scale: np.ndarray  # float16 [rows, cols/group]
    group: int
    form = "int4"
    scaling = "group"

    @property
    def rows(self) -> int:
        return self.data.shape[0]

    @property
    def cols(self) -> int:
        return 2 * self.data.shape[1]

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + self.scale.nbytes

    def integer(self, start: int, stop: int, out: np.ndarray) -> Affine:
        packed = self.data[start:stop]  # [take, cols/2]
        half = packed.shape[1]
        sixteens = np.empty((packed.shape[0], 2 * half), dtype=np.uint8)  # [take, cols]
        np.left_shift(packed, np.uint8(4), out=sixteens[:, :half])
        np.bitwise_and(packed, np.uint8(0xF0), out=sixteens[:, half:])
        np.copyto(out, sixteens.view(np.int8), casting="unsafe")  # 16 q
        scale = self.scale[start:stop].astype(np.float32)  # [take, groups]
        scale *= np.float32(1 / 16)
        return Affine(scale, None, self.group)

    def select(self, ids: np.ndarray | slice) -> "Int4Rows":
        return Int4Rows(self.data[ids], self.scale[ids], self.group)

    def kernel_args(self) -> tuple[str, np.ndarray, np.ndarray]:
        return "int4", self.data, self.scale  # [rows, cols/2], float16 [rows, groups]


@attrs.frozen
class PackedMatrix:
    """A float32 matrix [out, in] kept as ``parts`` stacked by rows, expanded chunk by chunk at each use.

    ``kernels`` is not part of its value: per products mode, the compiled product of each part that
    kestrel_trio._model.products.matmul resolved at the matrix's first product in that mode, kept with the weights
    so that later products do not ask the kernels' dispatch again; and, keyed ``("jobs", mode, threads)``, the job
    rows its products are shared with (kestrel_trio._model.products.jobs).
    """

    parts: tuple[Rows, ...]
    kernels: dict = attrs.field(init=False, factory=dict, eq=False, repr=False)

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(p.rows for p in self.parts), self.parts[0].cols)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    @property
    def forms(self) -> tuple[str, ...]:
        """The storage forms of the parts, in order (``("Q4_K", "Q6_K")``, ``("int8",)`` ...)."""
        return tuple(p.form for p in self.parts)

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """float32 rows ``ids`` [N] (an embedding lookup), [N, in]: only those rows are expanded.

        Raises:
            IndexError: an id outside ``0..out-1`` (a row of no part would be left as ``np.empty`` found it).
        """
        ids = np.asarray(ids)
        if ids.size and (ids.min() < 0 or ids.max() >= self.shape[0]):
            raise IndexError(f"row ids outside 0..{self.shape[0] - 1} (the smallest {ids.min()}, the largest "
                             f"{ids.max()})")
        out = np.empty((ids.size, self.shape[1]), dtype=np.float32)  # [N, in]
        first = 0
        for part in self.parts:
            mine = np.nonzero((ids >= first) & (ids < first + part.rows))[0]  # [M] positions in ids
            if mine.size:
                picked = part.select(ids[mine] - first)
                out[mine] = expand_part(picked, 0, picked.rows, np.empty((mine.size, part.cols), np.float32))
            first += part.rows
        return out

    def dense(self) -> np.ndarray:
        """Every weight as float32 [out, in]: the whole matrix expanded (tests and tools; never on a model's path)."""
        out = np.empty(self.shape, dtype=np.float32)  # [out, in]
        start = 0
        for part in self.parts:
            expand_part(part, 0, part.rows, out[start : start + part.rows])
            start += part.rows
        return out


def _bf16_parts(parts) -> tuple[Rows, ...]:
    return tuple(p if isinstance(p, Bf16Rows) else Bf16Rows(p) for p in parts)


@attrs.frozen
class Bf16Matrix(PackedMatrix):
    """A float32 matrix kept as bf16 bits (``weights="bf16"``): parts of uint16 [rows_i, in], usually mapped.

    bf16 is the top half of a float32, so the upcast is exact.
    """

    parts: tuple[Rows, ...] = attrs.field(converter=_bf16_parts)


Matrix = Union[np.ndarray, PackedMatrix]  # [out, in] float32, or a packed form expanded at use
