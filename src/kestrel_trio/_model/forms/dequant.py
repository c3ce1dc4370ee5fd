"""Expanding ggml's storage types to float32: F32, F16, BF16, the 32-weight blocks and the K-quants.

Every type stores a row as whole blocks (``block_size`` weights in
``type_size`` bytes), and blocks never straddle rows, so any set of rows
expands on its own: :func:`expand_rows` takes the bytes of whichever rows the
caller picked (a contiguous range, a chunk, a permutation, one expert of a
stacked tensor) and writes their float32 values. The products expand the
weights of a GGUF held as stored (``weights="gguf"``) this way, chunk by
chunk, just in time (kestrel_trio._model.forms.packed, kestrel_trio._model.products.matmul).

Each quantized type is a per-group affine map of small integers: a row of
``cols`` weights is ``cols / group`` groups, and weight ``k`` of group ``g``
is ``scale[g] * q[k] (+ offset[g])``. :func:`integer_part` writes the
integers ``q`` (exact in float32) and returns the groups' scales and offsets
(:class:`Affine`); :func:`apply_affine` finishes the expansion. A product may
instead multiply the integers and apply the scales to partial sums, which is
the same algebra with fewer passes over the weights (kestrel_trio._model.products.matmul).

The arithmetic is ggml's reference dequantization, in its order of float32
operations (``d * q``, ``d * q + m``, ``(d * scale) * q - dmin * min``), so
the values equal llama.cpp's and ``gguf``'s bit for bit. Block layouts (byte
offsets within one block):

* Q8_0 (32 weights, 34 bytes): fp16 d; 32 int8 q. w = q * d.
* Q4_0 (32, 18): fp16 d; 16 bytes of nibbles, low nibbles weights 0-15, high
  nibbles 16-31. w = d * (q - 8).
* Q4_1 (32, 20): fp16 d, fp16 m; nibbles as Q4_0. w = d * q + m.
* Q5_0 (32, 22): fp16 d; uint32 of fifth bits (bit j for weight j); nibbles
  as Q4_0. w = d * (q - 16).
* Q5_1 (32, 24): fp16 d, fp16 m; fifth bits; nibbles. w = d * q + m.
* Q4_K (256, 144): fp16 d, fp16 dmin; 12 bytes packing eight 6-bit scales and
  eight 6-bit mins; 128 bytes of nibbles, each 32 bytes holding two
  sub-blocks of 32 (low nibbles first). w = (d * scale) * q - dmin * min.
* Q5_K (256, 176): as Q4_K plus 32 bytes of fifth bits before the nibbles
  (bit j of byte l for weight l of sub-block j).
* Q6_K (256, 210): 128 bytes of low nibbles, 64 bytes of 2-bit high parts, 16
  int8 scales (one per 16 weights), fp16 d. w = (d * scale) * (q - 32).
"""

from __future__ import annotations

from typing import Callable, Optional

import attrs
import numpy as np

__all__ = ["GgmlType", "GGML_TYPES", "GGML_TYPE_BY_NAME", "FLOAT_TYPES", "Affine", "integer_part", "apply_affine",
           "expand_rows", "dequantize_blocks", "q8_0_in_place"]

QK_K = 256  # weights per K-quant super-block


@attrs.frozen
class GgmlType:
    """One ggml storage type: its id in GGUF files, name, and block geometry (weights, bytes)."""

    type_id: int
    name: str
    block_size: int
    type_size: int


@attrs.frozen
class Affine:
    """How the integers of some rows become their weights: ``scale * q (+ offset)`` per group.

    Attributes:
        scale: float32 [rows, groups].
        offset: float32 [rows, groups], or None (symmetric types).
        group: weights per group along a row (a row's width: one scale per row).
    """

    scale: np.ndarray
    offset: Optional[np.ndarray]
    group: int


def _fp16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The fp16 at (even) byte ``start`` of each block [n, bytes] (an even size), as float32 [n, 1]."""
    return blocks.view("<u2")[:, start // 2 : start // 2 + 1].view("<f2").astype(np.float32)  # [n, 1]


# Byte-wise masks applied to four packed bytes at once (a uint32 word per four bytes, little-endian).
_LOW4 = np.uint32(0x0F0F0F0F)
_LOW2 = np.uint32(0x03030303)
_FOUR = np.uint32(4)


def _words(packed: np.ndarray) -> np.ndarray:
    """Bytes [n, 4k] (rows may be strided) as uint32 words [n, k]: bitwise work on a quarter of the elements."""
    return packed.view("<u4")


def _split_nibbles(words: np.ndarray, out: np.ndarray) -> None:
    """Low nibbles of ``words`` [..., k] into ``out[..., 0, :]``, high nibbles into ``out[..., 1, :]`` (uint32)."""
    np.bitwise_and(words, _LOW4, out=out[..., 0, :])
    high = out[..., 1, :]
    np.right_shift(words, _FOUR, out=high)
    high &= _LOW4


# A kernel writes the integers (or, for the float types, the values) of blocks [n, type_size] into
# out float32 [n, block_size] and returns (scale [n, g], offset [n, g] or None, group), or None.
_Groups = Optional[tuple[np.ndarray, Optional[np.ndarray], int]]


def _f32(blocks: np.ndarray, out: np.ndarray) -> _Groups:
    np.copyto(out, blocks.view("<f4"))
    return None


def _f16(blocks: np.ndarray, out: np.ndarray) -> _Groups:
    np.copyto(out, blocks.view("<f2"), casting="unsafe")
    return None


def _bf16(blocks: np.ndarray, out: np.ndarray) -> _Groups:
    bits = out.view(np.uint32)  # [n, 1] the destination's bits
    np.copyto(bits, blocks.view("<u2"), casting="unsafe")
    bits <<= 16  # bf16 is the top half of a float32: exact
    return None


def _signed(unsigned: np.ndarray, bias: int, out: np.ndarray) -> None:
    """``unsigned - bias`` (uint8 [n, k], each below ``bias + 128``) into float32 ``out``, exactly, via int8.

    The subtraction wraps in uint8 (in place: ``unsigned`` is a temporary) and
    the int8 view of the result is the signed value, so one cast does the rest.
    """
    unsigned -= np.uint8(bias)  # wraps: viewed as int8 it is the signed value
    np.copyto(out, unsigned.view(np.int8), casting="unsafe")


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """Bytes [n, 16] to their low nibbles then high nibbles, uint8 [n, 32]."""
    out = np.empty((packed.shape[0], 2, 4), dtype=np.uint32)  # [n, nibble, word]
    _split_nibbles(_words(packed), out)
    return out.view(np.uint8).reshape(-1, 32)  # [n, 32]


def _q8_0(blocks: np.ndarray, out: np.ndarray) -> _Groups:
    np.copyto(out, blocks[:, 2:].view(np.int8), casting="unsafe")  # [n, 32]
    return _fp16(blocks, 0), None, 32  # w = q * d


def _q4_0(blocks: np.ndarray, out: np.ndarray) -> _Groups:
    _signed(_nibbles(blocks[:, 2:18]), 8, out)  # [n, 32]
    return _fp16(blocks, 0), None, 32  # w = d * (q - 8)


def _q4_1(blocks: np.ndarray, out: np.ndarray) -> _Groups:
    np.copyto(out, _nibbles(blocks[:, 4:20]), casting="unsafe")  # [n, 32]
    return _fp16(blocks, 0), _fp16(blocks, 2), 32  # w = d * q + m


def _fifth_bits(blocks: np.ndarray, start: int) -> np.ndarray:
    """Bit j of the uint32 at byte ``start``, for j = 0..31, as uint8 [n, 32] (0 or 16)."""
    bits = np.unpackbits(np.ascontiguousarray(blocks[:, start : start + 4]), axis=-1, bitorder="little")  # [n, 32]
    bits <<= np.uint8(4)
    return bits


def _q5_0(blocks: np.ndarray, out: np.ndarray) -> _Groups:
    q = _nibbles(blocks[:, 6:22])  # [n, 32]
    q |= _fifth_bits(blocks, 2)
    _signed(q, 16, out)
    return _fp16(blocks, 0), None, 32  # w = d * (q - 16)


def _q5_1(blocks: np.ndarray, out: np.ndarray) -> _Groups:
    q = _nibbles(blocks[:, 8:24])  # [n, 32]
    q |= _fifth_bits(blocks, 4)
    np.copyto(out, q, casting="unsafe")
    return _fp16(blocks, 0), _fp16(blocks, 2), 32  # w = d * q + m


def _contiguous_words(blocks: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Bytes [start, stop) of each block, copied contiguous (a cheap strided memcpy), as uint32 words [n, k].

    Bitwise work on contiguous words runs in long loops over a quarter of the
    elements; on the strided bytes of each block it would run in loops of a
    few elements, which costs numpy several times more.
    """
    return np.ascontiguousarray(blocks[:, start:stop]).view("<u4")


def _k_scales_mins(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The eight 6-bit scales and mins of Q4_K/Q5_K from their 12 bytes (4-15), each float32 [n, 8].

    Sub-blocks 0-3: scale = byte j & 63, min = byte j+4 & 63. Sub-blocks 4-7
    (k = j-4): the low four bits come from byte k+8 (scale low nibble, min
    high nibble), the top two from the spare bits 6-7 of bytes k (scale) and
    k+4 (min). Each is an operation on words of four bytes, scales and mins
    side by side: a few calls whatever the block count.
    """
    words = _contiguous_words(blocks, 4, 16)  # [n, 3]: bytes 0-3, 4-7, 8-11 of the twelve
    packed = np.empty((words.shape[0], 2, 2), dtype=np.uint32)  # [n, scale|min, sub-blocks 0-3|4-7]
    np.bitwise_and(words[:, :2], np.uint32(0x3F3F3F3F), out=packed[:, :, 0])
    low = packed[:, :, 1]  # [n, 2]: the low four bits of 4-7, from byte k+8's two nibbles
    np.right_shift(words[:, 2:3], _SHIFTS_0_4, out=low)
    low &= _LOW4
    low |= (words[:, :2] >> np.uint32(2)) & np.uint32(0x30303030)  # bits 6-7 of bytes k, k+4 as bits 4-5
    values = packed.view(np.uint8).reshape(-1, 16).astype(np.float32)  # [n, 16]
    return values[:, :8], values[:, 8:]  # [n, 8] each


_SHIFTS_0_4 = np.array([[0, 4]], dtype=np.uint32)  # [1, 2]: scales' nibble, mins' nibble


def _k_low_nibbles(blocks: np.ndarray, start: int, fifth: np.ndarray | None, out: np.ndarray) -> None:
    """The 4-bit parts of eight sub-blocks of 32 (bytes [start, start+128)), plus ``fifth`` bits, into ``out``.

    Each 32 bytes hold sub-block 2g in their low nibbles and 2g+1 in their high
    ones. ``fifth``: uint32 words [n, 8, 8] of the sub-blocks' fifth bits, already
    shifted to bit 4 (Q5_K), or None. ``out``: float32 [n, 256].
    """
    words = _contiguous_words(blocks, start, start + 128).reshape(-1, 4, 8)  # [n, 4, 8]
    low = words & _LOW4  # [n, 4, 8]: sub-blocks 0, 2, 4, 6
    high = words >> _FOUR  # [n, 4, 8]: sub-blocks 1, 3, 5, 7
    high &= _LOW4
    if fifth is not None:
        low |= fifth[:, 0::2]
        high |= fifth[:, 1::2]
    natural = out.reshape(-1, 4, 2, 32)  # [n, 4, 2, 32]: sub-block 2g + h at [:, g, h]
    np.copyto(natural[:, :, 0], low.view(np.uint8).reshape(-1, 4, 32), casting="unsafe")
    np.copyto(natural[:, :, 1], high.view(np.uint8).reshape(-1, 4, 32), casting="unsafe")


def _k_groups(blocks: np.ndarray) -> _Groups:
    """Q4_K/Q5_K: w = (d * scale) * q - dmin * min over eight sub-blocks of 32."""
    scales, mins = _k_scales_mins(blocks)  # [n, 8] each
    d_dmin = blocks.view("<u2")[:, 0:2].view("<f2").astype(np.float32)  # [n, 2]: d, dmin
    scale = scales * d_dmin[:, 0:1]  # [n, 8]
    d_dmin[:, 1] *= np.float32(-1)  # -(dmin * min) == (-dmin) * min exactly: adding it is subtracting dmin * min
    offset = mins * d_dmin[:, 1:2]  # [n, 8]
    return scale, offset, 32


def _q4_k(blocks: np.ndarray, out: np.ndarray) -> _Groups:
    _k_low_nibbles(blocks, 16, None, out)
    return _k_groups(blocks)


def _q5_k(blocks: np.ndarray, out: np.ndarray) -> _Groups:
    # Bit j of byte l of the 32 high-bit bytes belongs to weight l of sub-block j.
    high = _contiguous_words(blocks, 16, 48)  # [n, 8]
    fifth = (high[:, None, :] >> np.arange(8, dtype=np.uint32)[None, :, None]) & np.uint32(0x01010101)  # [n, 8, 8]
    fifth <<= _FOUR
    _k_low_nibbles(blocks, 48, fifth, out)
    return _k_groups(blocks)


def _q6_k(blocks: np.ndarray, out: np.ndarray) -> _Groups:
    n = blocks.shape[0]
    low = _contiguous_words(blocks, 0, 128).reshape(n, 2, 2, 8)  # [n, half, which 32 bytes, 8 words]
    high = _contiguous_words(blocks, 128, 192).reshape(n, 2, 1, 8)  # [n, half, 1, 8 words]
    # In each half of 128 weights, quarter k (weights 32k..32k+31, byte i) takes the low nibble of low
    # byte 32k + i (k < 2) or the high nibble of byte 32(k-2) + i, and bits 2k, 2k+1 of high byte i.
    twos = high >> (np.arange(4, dtype=np.uint32) * np.uint32(2))[None, None, :, None]  # [n, half, 4, 8]
    twos &= _LOW2
    twos <<= _FOUR
    quarters = twos.reshape(n, 2, 2, 2, 8)  # [n, half, nibble, which, 8]
    quarters[:, :, 0] |= low & _LOW4
    quarters[:, :, 1] |= (low >> _FOUR) & _LOW4
    _signed(twos.view(np.uint8).reshape(n, QK_K), 32, out)  # [n, 256]
    scales = blocks[:, 192:208].view(np.int8).astype(np.float32)  # [n, 16]
    return _fp16(blocks, 208) * scales, None, 16  # w = (d * scale) * (q - 32)


_KERNELS: dict[str, Callable[[np.ndarray, np.ndarray], _Groups]] = {
    "F32": _f32, "F16": _f16, "BF16": _bf16, "Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0,
    "Q5_1": _q5_1, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k,
}

GGML_TYPES: dict[int, GgmlType] = {t.type_id: t for t in (
    GgmlType(0, "F32", 1, 4), GgmlType(1, "F16", 1, 2), GgmlType(2, "Q4_0", 32, 18), GgmlType(3, "Q4_1", 32, 20),
    GgmlType(6, "Q5_0", 32, 22), GgmlType(7, "Q5_1", 32, 24), GgmlType(8, "Q8_0", 32, 34),
    GgmlType(12, "Q4_K", QK_K, 144), GgmlType(13, "Q5_K", QK_K, 176), GgmlType(14, "Q6_K", QK_K, 210),
    GgmlType(30, "BF16", 1, 2),
)}
GGML_TYPE_BY_NAME = {t.name: t for t in GGML_TYPES.values()}

# Rows expanded per step of expand_rows: temporaries of a few MiB whatever the tensor.
CHUNK_WEIGHTS = 1 << 18


def _view(array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``array`` reshaped without a copy (a copy would lose the writes), or ValueError."""
    view = array.view()
    view.shape = shape
    return view


def integer_part(ggml_type: GgmlType, raw: np.ndarray, out: np.ndarray) -> Affine | None:
    """Write the integers of rows ``raw`` into ``out``; their groups' scales and offsets (None: float types).

    Args:
        ggml_type: the storage type.
        raw: uint8 [rows, row_bytes], whole blocks per row, C-contiguous (a row range of a mapped tensor is).
        out: float32 [rows, cols], C-contiguous: the integers, exact (float types: the values themselves).
    """
    rows = raw.shape[0]
    blocks = _view(raw, (-1, ggml_type.type_size))  # [rows*blocks_per_row, type_size]
    groups = _KERNELS[ggml_type.name](blocks, _view(out, (blocks.shape[0], ggml_type.block_size)))
    if groups is None:
        return None
    scale, offset, group = groups
    return Affine(scale.reshape(rows, -1), None if offset is None else offset.reshape(rows, -1), group)


def apply_affine(affine: Affine | None, out: np.ndarray) -> None:
    """Turn the integers in ``out`` (float32 [rows, cols], C-contiguous) into their weights, in place.

    ggml's order of float32 operations: ``scale * q``, then ``+ offset``.
    """
    if affine is None:
        return
    grouped = _view(out, (out.shape[0], -1, affine.group))  # [rows, groups, group]
    grouped *= affine.scale[:, :, None]
    if affine.offset is not None:
        grouped += affine.offset[:, :, None]


FLOAT_TYPES = ("F32", "F16", "BF16")  # values stored as they are: no groups, no scales


def q8_0_in_place(raw: np.ndarray, scratch: np.ndarray) -> tuple[np.ndarray, Affine]:
    """Q8_0 rows' integers as float32 [rows, groups, 32], cast in place: a strided view of ``scratch``.

    Every byte of the rows, scales included, is cast from int8 in one
    contiguous pass (twice as fast here as gathering the 32 quants of each
    34-byte block), and the result is the quants' window of each block; a
    product reads it as a strided matrix, BLAS's leading dimension.

    Args:
        raw: uint8 [rows, row_bytes], C-contiguous.
        scratch: float32, at least rows * row_bytes elements.
    """
    rows, row_bytes = raw.shape
    blocks = _view(raw, (-1, 34))  # [rows*groups, 34]
    cast = scratch[: raw.size].reshape(blocks.shape)  # [rows*groups, 34]
    np.copyto(cast, blocks.view(np.int8), casting="unsafe")
    values = cast[:, 2:].reshape(rows, row_bytes // 34, 32)  # [rows, groups, 32] a view
    return values, Affine(_fp16(blocks, 0).reshape(rows, -1), None, 32)


def dequantize_blocks(ggml_type: GgmlType, blocks: np.ndarray) -> np.ndarray:
    """Blocks of ``ggml_type``, uint8 [n, type_size], as float32 [n, block_size]."""
    blocks = np.ascontiguousarray(blocks)
    out = np.empty((blocks.shape[0], ggml_type.block_size), dtype=np.float32)  # [n, block_size]
    apply_affine(integer_part(ggml_type, blocks, out), out)
    return out


def expand_rows(ggml_type: GgmlType, raw: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Rows stored as ``ggml_type`` (uint8 [rows, row_bytes], any rows of a tensor) as float32 [rows, cols].

    Args:
        ggml_type: the storage type.
        raw: the rows' bytes, whole blocks per row (a view of the file is fine).
        out: float32 [rows, cols] to write into (e.g. a slice of a fused matrix); a new array if None.

    Returns:
        ``out``, or the new array.
    """
    rows, row_bytes = raw.shape
    blocks_per_row = row_bytes // ggml_type.type_size
    cols = blocks_per_row * ggml_type.block_size
    if out is None:
        out = np.empty((rows, cols), dtype=np.float32)  # [rows, cols]
    step = max(1, CHUNK_WEIGHTS // cols)
    scratch = np.empty((min(step, rows), cols), dtype=np.float32)  # [step, cols]
    for start in range(0, rows, step):
        chunk = np.ascontiguousarray(raw[start : start + step])  # [r, row_bytes]
        target = out[start : start + chunk.shape[0]]  # [r, cols]
        work = target if target.flags.c_contiguous else scratch[: chunk.shape[0]]  # [r, cols]
        apply_affine(integer_part(ggml_type, chunk, work), work)
        if work is not target:
            target[...] = work
    return out
