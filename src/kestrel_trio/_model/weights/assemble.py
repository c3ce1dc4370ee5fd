"""Weights of a Qwen or Llama decoder, assembled by their checkpoint names.

The loader (kestrel_trio._model.weights.residency) first checks the checkpoint's
tensor names and shapes against the config (see
:mod:`kestrel_trio._model.checkpoints.shapes`): a missing tensor, an unexpected one and a
wrong shape are each reported by name before any data is read. Then one
*source* per residency hands out the matrices (float32 arrays, or the packed
forms of kestrel_trio._model.forms.packed) and :func:`assemble_from` puts them in
place. Arrays are read-only: weights are shared by every request.

Layout: every matrix keeps the checkpoint's
[out, in] row-major layout, so ``x @ W.T`` is one BLAS call with no copy and a
tied lm_head is the embedding itself. Projections that read the same input are
fused at load into one matrix, so a layer makes one call where it made three:
q/k/v into ``Attention.qkv_proj`` and gate/up into ``DenseMLP.gate_up_proj``;
the separate names stay as row views of the fused matrix.
"""

from __future__ import annotations

from typing import Callable, Sequence

import attrs
import numpy as np

from kestrel_trio._model.checkpoints.config import ModelConfig
from kestrel_trio._model.forms.packed import Bf16Matrix, Matrix, PackedMatrix
from kestrel_trio._model.weights.resident import is_mapped
from kestrel_trio._model.checkpoints.safetensors import SafetensorsCheckpoint
from kestrel_trio._model.checkpoints.shapes import moe_layout

__all__ = [
    "Bf16Matrix", "Matrix", "PackedMatrix", "Attention", "DenseMLP", "SparseMoE", "Layer", "Weights",
    "assemble_weights", "assemble_from", "fp32_source", "bf16_source", "stacked_vectors", "CheckpointReader",
    "fused_rows", "own_copy", "row_tables",
]


@attrs.frozen
class Attention:
    q_proj: Matrix  # [n_heads*head_dim, hidden]
    k_proj: Matrix  # [n_kv*head_dim, hidden]
    v_proj: Matrix  # [n_kv*head_dim, hidden]
    o_proj: Matrix  # [hidden, n_heads*head_dim]
    q_bias: np.ndarray | None  # [n_heads*head_dim]
    k_bias: np.ndarray | None  # [n_kv*head_dim]
    v_bias: np.ndarray | None  # [n_kv*head_dim]
    o_bias: np.ndarray | None  # [hidden]
    q_norm: np.ndarray | None  # [head_dim]
    k_norm: np.ndarray | None  # [head_dim]
    # q, k and v stacked by rows; q_proj/k_proj/v_proj are views of it when set.
    qkv_proj: Matrix | None = None  # [(n_heads + 2*n_kv)*head_dim, hidden]
    qkv_bias: np.ndarray | None = None  # [(n_heads + 2*n_kv)*head_dim]


@attrs.frozen
class DenseMLP:
    gate_proj: Matrix  # [inter, hidden]
    up_proj: Matrix  # [inter, hidden]
    down_proj: Matrix  # [hidden, inter]
    # gate over up by rows; gate_proj/up_proj are views of it when set.
    gate_up_proj: Matrix | None = None  # [2*inter, hidden]
    # Llama's mlp_bias: biases of gate, up (stacked like the weights, views of gate_up_bias) and down.
    gate_bias: np.ndarray | None = None  # [inter]
    up_bias: np.ndarray | None = None  # [inter]
    down_bias: np.ndarray | None = None  # [hidden]
    gate_up_bias: np.ndarray | None = None  # [2*inter]

    @classmethod
    def fused(cls, gate_up_proj: np.ndarray, down_proj: np.ndarray) -> "DenseMLP":
        """An MLP from gate and up stacked by rows (``gate_up_proj`` [2*inter, hidden])."""
        inter = gate_up_proj.shape[0] // 2
        return cls(
            gate_proj=gate_up_proj[:inter],  # [inter, hidden]
            up_proj=gate_up_proj[inter:],  # [inter, hidden]
            down_proj=down_proj,  # [hidden, inter]
            gate_up_proj=gate_up_proj,  # [2*inter, hidden]
        )


@attrs.frozen
class SparseMoE:
    router: np.ndarray  # [n_experts, hidden]
    experts: tuple[DenseMLP, ...]  # n_experts of [moe_inter, hidden] / [hidden, moe_inter]


@attrs.frozen
class Layer:
    input_layernorm: np.ndarray  # [hidden]
    attn: Attention
    post_attention_layernorm: np.ndarray  # [hidden]
    mlp: DenseMLP | SparseMoE


@attrs.frozen
class Weights:
    embed_tokens: Matrix  # [vocab, hidden]
    layers: tuple[Layer, ...]
    norm: np.ndarray  # [hidden]
    lm_head: Matrix  # [vocab, hidden] (embed_tokens itself when tied)


class CheckpointReader:
    """Reads a checked checkpoint's tensors by name, calling ``progress`` with the fraction of bytes read (0 to 1)."""

    def __init__(self, checkpoint: SafetensorsCheckpoint, progress: Callable[[float], None] | None = None) -> None:
        self.checkpoint = checkpoint
        self._progress = progress
        self._total = sum(info.nbytes for info in checkpoint.tensors.values()) or 1
        self._done = 0

    def _advance(self, name: str) -> None:
        self._done += self.checkpoint.tensors[name].nbytes
        if self._progress is not None:
            self._progress(min(1.0, self._done / self._total))

    def read(self, name: str) -> np.ndarray:
        """The tensor as float32."""
        array = self.checkpoint.read(name)
        self._advance(name)
        return array

    def read_bf16(self, name: str) -> np.ndarray:
        """The tensor as bf16 bits (uint16), memory-mapped when stored as bf16."""
        array = self.checkpoint.read_bf16(name)
        self._advance(name)
        return array

    def read_into(self, name: str, out: np.ndarray) -> None:
        """The tensor as float32, written into ``out``."""
        self.checkpoint.read_into(name, out)
        self._advance(name)

    def advance(self, name: str) -> None:
        """Count tensor ``name`` as read (its storage is used as it is, e.g. mapped)."""
        self._advance(name)

    def finish(self) -> None:
        """Report every byte read (the rest came from elsewhere, e.g. a quantized cache)."""
        if self._progress is not None:
            self._progress(1.0)


ReadInto = Callable[[str, np.ndarray], None]


class _Fp32Source:
    """float32 matrices, each an array of its own (but row tables); stacked ones are copied into one new array."""

    def __init__(self, read: Callable[[str], np.ndarray], read_into: ReadInto,
                 row_tables: frozenset[str] = frozenset()) -> None:
        self.vector = self._read = read
        self._read_into = read_into
        self._row_tables = row_tables

    def matrix(self, name: str) -> np.ndarray:
        """Matrix ``name``, read into a new array where the checkpoint's float32 storage would be mapped.

        A mapped matrix lives in the page cache's pages, 4 KiB ones unless the
        file was read in as large folios; a new array is numpy's, which asks
        for transparent huge pages. Measured on the 2-core Xeon, Qwen3-0.6B
        shapes from an fp32 checkpoint (its o/down projections and the tied
        embedding mapped, the rest fused copies): a decode step took 108 ms
        mapped, 89 ms read into arrays (kestrel_trio._model.weights.resident).
        A matrix in ``row_tables`` (an untied embedding: only its tokens' rows
        are read, never the whole of it in a step) stays mapped, so that the
        rows no prompt uses never take memory.
        """
        array = self._read(name)
        if name in self._row_tables or not is_mapped(array):
            return array
        return own_copy(array)

    def stacked(self, parts: list[tuple[str, int]], *tail: int) -> tuple[np.ndarray, list[np.ndarray]]:
        return fused_rows([(rows, lambda out, n=name: self._read_into(n, out)) for name, rows in parts], *tail)

    def fused_experts(self, gate_up_name: str, down_name: str, count: int) -> tuple[DenseMLP, ...]:
        gate_up, down = self.matrix(gate_up_name), self.matrix(down_name)  # [n_experts, ...] each
        return tuple(DenseMLP.fused(gate_up[j], down[j]) for j in range(count))


class _Bf16Source:
    """bf16-bit matrices (memory-mapped when stored as bf16); stacking only lists the parts."""

    def __init__(self, read: Callable[[str], np.ndarray], read_bf16: Callable[[str], np.ndarray]) -> None:
        self.vector = read
        self._read_bf16 = read_bf16

    def matrix(self, name: str) -> Bf16Matrix:
        return Bf16Matrix((self._read_bf16(name),))

    def stacked(self, parts: list[tuple[str, int]], *tail: int) -> tuple[Matrix, list[Matrix]]:
        if not tail:  # biases are small: plain float32
            return stacked_vectors(self.vector, parts)
        bits = [self._read_bf16(name) for name, _ in parts]  # each [rows_i, in]
        return Bf16Matrix(tuple(bits)), [Bf16Matrix((b,)) for b in bits]

    def fused_experts(self, gate_up_name: str, down_name: str, count: int) -> tuple[DenseMLP, ...]:
        gate_ups, downs = self._read_bf16(gate_up_name), self._read_bf16(down_name)  # bits, [n_experts, ...]
        experts = []
        for gate_up, down in zip(gate_ups[:count], downs[:count]):
            inter = gate_up.shape[0] // 2
            experts.append(DenseMLP(gate_proj=Bf16Matrix((gate_up[:inter],)), up_proj=Bf16Matrix((gate_up[inter:],)),
                                    down_proj=Bf16Matrix((down,)), gate_up_proj=Bf16Matrix((gate_up,))))
        return tuple(experts)


def fused_rows(parts: Sequence[tuple[int, Callable[[np.ndarray], None]]], *tail: int
               ) -> tuple[np.ndarray, list[np.ndarray]]:
    """One read-only float32 array [sum(rows), *tail] of ``parts`` one after another, and each part's view.

    Args:
        parts: per part, its rows and what fills its float32 [rows, *tail] stretch of the array.
    """
    out = np.empty((sum(rows for rows, _ in parts), *tail), dtype=np.float32)  # [sum(rows), *tail]
    views, start = [], 0
    for rows, fill in parts:
        fill(out[start : start + rows])
        views.append(out[start : start + rows])  # [rows, *tail]
        start += rows
    out.flags.writeable = False
    return out, views


def own_copy(mapped: np.ndarray) -> np.ndarray:
    """A read-only float32 copy of ``mapped`` [*shape] in an array of its own (numpy asks for huge pages)."""
    out = np.empty(mapped.shape, dtype=np.float32)  # [*shape]
    out[...] = mapped
    out.flags.writeable = False
    return out


def stacked_vectors(read: Callable[[str], np.ndarray], parts: list[tuple[str, int]]) -> tuple[np.ndarray, list]:
    """Vectors (biases) stacked into one new float32 array, and views of their parts: what sources share."""
    return _Fp32Source(read, _copy_into(read)).stacked(parts)


def _copy_into(read: Callable[[str], np.ndarray]) -> ReadInto:
    def read_into(name: str, out: np.ndarray) -> None:
        out[...] = read(name).reshape(out.shape)

    return read_into


def assemble_weights(
    config: ModelConfig, read: Callable[[str], np.ndarray], names: set[str], read_into: ReadInto | None = None
) -> Weights:
    """Build float32 :class:`Weights` from checked tensors, fusing q/k/v and gate/up.

    Args:
        config: the model's configuration.
        read: returns the float32 tensor of a checkpoint name.
        names: every tensor name present (tells the MoE expert layout).
        read_into: fills a float32 destination with a checkpoint tensor (used
            to build fused matrices without a second copy); defaults to
            copying what ``read`` returns.
    """
    return assemble_from(config, names, _Fp32Source(read, read_into or _copy_into(read)))


def fp32_source(reader: CheckpointReader, rename: Callable[[str], str] = lambda name: name, *,
                tied_embeddings: bool = True) -> _Fp32Source:
    """Where fp32 residency's matrices come from: float32 reads of ``reader``'s tensors, fused by copying.

    An untied embedding is only looked up by row: it may stay mapped (:meth:`_Fp32Source.matrix`).
    """
    return _Fp32Source(lambda n: reader.read(rename(n)), lambda n, out: reader.read_into(rename(n), out),
                       row_tables(tied_embeddings))


def row_tables(tied_embeddings: bool) -> frozenset[str]:
    """The matrices a step only looks rows up in (an untied embedding): they may stay mapped."""
    return frozenset() if tied_embeddings else frozenset({"model.embed_tokens.weight"})


def bf16_source(reader: CheckpointReader, rename: Callable[[str], str] = lambda name: name) -> _Bf16Source:
    """Where bf16 residency's matrices come from: bf16 bits of ``reader``'s tensors, mapped when stored so."""
    return _Bf16Source(lambda n: reader.read(rename(n)), lambda n: reader.read_bf16(rename(n)))


def assemble_from(config: ModelConfig, names: set[str], source) -> Weights:
    """Build :class:`Weights` from ``source``'s tensors (by Qwen3 names).

    A source has ``vector(name)`` (float32), ``matrix(name)``,
    ``stacked([(name, rows), ...], *tail)`` (a fused matrix and views of its
    parts; no ``tail``: vectors) and ``fused_experts(gate_up, down, count)``.
    """
    embed = source.matrix("model.embed_tokens.weight")  # [vocab, hidden]
    layers = tuple(_load_layer(source, config, i, names) for i in range(config.num_hidden_layers))
    return Weights(
        embed_tokens=embed,
        layers=layers,
        norm=source.vector("model.norm.weight"),  # [hidden]
        lm_head=embed if config.tie_word_embeddings else source.matrix("lm_head.weight"),  # [vocab, hidden]
    )


def _load_attention(source, config: ModelConfig, a: str) -> Attention:
    hd, h = config.head_dim, config.hidden_size
    q_rows, kv_rows = config.num_attention_heads * hd, config.num_key_value_heads * hd
    parts = [("q_proj", q_rows), ("k_proj", kv_rows), ("v_proj", kv_rows)]
    qkv, (q, k, v) = source.stacked([(f"{a}{p}.weight", rows) for p, rows in parts], h)  # [q_rows + 2*kv_rows, hidden]
    bias, biases = (None, (None, None, None))
    if config.qkv_bias:
        bias, biases = source.stacked([(f"{a}{p}.bias", rows) for p, rows in parts])  # [q_rows + 2*kv_rows]

    def optional(name: str, present: bool) -> np.ndarray | None:
        return source.vector(name) if present else None

    return Attention(
        q_proj=q,  # [n_heads*head_dim, hidden]
        k_proj=k,  # [n_kv*head_dim, hidden]
        v_proj=v,  # [n_kv*head_dim, hidden]
        o_proj=source.matrix(a + "o_proj.weight"),  # [hidden, n_heads*head_dim]
        q_bias=biases[0],  # [n_heads*head_dim]
        k_bias=biases[1],  # [n_kv*head_dim]
        v_bias=biases[2],  # [n_kv*head_dim]
        o_bias=optional(a + "o_proj.bias", config.o_bias),  # [hidden]
        q_norm=optional(a + "q_norm.weight", config.qk_norm),  # [head_dim]
        k_norm=optional(a + "k_norm.weight", config.qk_norm),  # [head_dim]
        qkv_proj=qkv,  # [(n_heads + 2*n_kv)*head_dim, hidden]
        qkv_bias=bias,  # [(n_heads + 2*n_kv)*head_dim]
    )


def _load_mlp(source, p: str, inter: int, hidden: int, bias: bool = False) -> DenseMLP:
    """A dense MLP from ``{p}gate_proj.weight`` etc., gate and up fused; with ``bias``, their biases too."""
    gate_up, (gate, up) = source.stacked([(p + "gate_proj.weight", inter), (p + "up_proj.weight", inter)], hidden)
    mlp = DenseMLP(gate_proj=gate, up_proj=up, down_proj=source.matrix(p + "down_proj.weight"), gate_up_proj=gate_up)
    if not bias:
        return mlp
    gate_up_bias, (gate_bias, up_bias) = source.stacked([(p + "gate_proj.bias", inter), (p + "up_proj.bias", inter)])
    return attrs.evolve(mlp, gate_bias=gate_bias, up_bias=up_bias, gate_up_bias=gate_up_bias,  # [2*inter]
                        down_bias=source.vector(p + "down_proj.bias"))  # [hidden]


def _load_layer(source, config: ModelConfig, i: int, names: set[str]) -> Layer:
    p = f"model.layers.{i}."
    mlp: DenseMLP | SparseMoE
    if config.is_sparse_layer(i):
        mlp = _load_moe(source, config, p, moe_layout(config, names, i))
    else:
        mlp = _load_mlp(source, p + "mlp.", config.intermediate_size, config.hidden_size, config.mlp_bias)
    return Layer(
        input_layernorm=source.vector(p + "input_layernorm.weight"),  # [hidden]
        attn=_load_attention(source, config, p + "self_attn."),
        post_attention_layernorm=source.vector(p + "post_attention_layernorm.weight"),  # [hidden]
        mlp=mlp,
    )


def _load_moe(source, config: ModelConfig, p: str, layout: str) -> SparseMoE:
    inter, h = config.moe_intermediate_size, config.hidden_size
    router = source.vector(p + "mlp.gate.weight")  # [n_experts, hidden] float32: every token reads it
    if layout == "fused":  # [n_experts, 2*moe_inter, hidden] and [n_experts, hidden, moe_inter]
        experts = source.fused_experts(p + "mlp.experts.gate_up_proj", p + "mlp.experts.down_proj", config.num_experts)
    else:
        e = p + "mlp.experts."
        experts = tuple(_load_mlp(source, f"{e}{j}.", inter, h) for j in range(config.num_experts))
    return SparseMoE(router=router, experts=experts)
