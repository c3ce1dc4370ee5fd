"""Weights of a Qwen or Llama decoder, loaded by their checkpoint names and checked.

The loader first checks the checkpoint's tensor names and shapes against the
config (see :mod:`kestrel_trio._model.shapes`): a missing tensor, an
unexpected one and a wrong shape are each reported by name before any data is
read. Arrays are read-only: weights are shared by every request.

Layout (see docs/performance.md): every matrix keeps the checkpoint's
[out, in] row-major layout, so ``x @ W.T`` is one BLAS call with no copy and a
tied lm_head is the embedding itself. Projections that read the same input are
fused at load into one matrix, so a layer makes one call where it made three:
q/k/v into ``Attention.qkv_proj`` and gate/up into ``DenseMLP.gate_up_proj``;
the separate names stay as row views of the fused matrix.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

import attrs
import numpy as np

from kestrel_trio._model.config import ModelConfig
from kestrel_trio._model.packed import Bf16Matrix, Matrix, PackedMatrix
from kestrel_trio._model.safetensors import SafetensorsCheckpoint
from kestrel_trio._model.shapes import check_tensors, moe_layout
from kestrel_trio.errors import ModelLoadError

log = logging.getLogger(__name__)

__all__ = [
    "Bf16Matrix", "Matrix", "RESIDENCIES", "resolve_residency", "Attention", "DenseMLP", "SparseMoE", "Layer",
    "Weights", "load_weights", "assemble_weights", "assemble_resident", "CheckpointReader",
]

RESIDENCIES = ("fp32", "bf16")  # how matrices are held: float32 arrays, or bf16 bits upcast at use


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


def load_weights(
    folder: Path, config: ModelConfig, progress: Callable[[float], None] | None = None, residency: str = "fp32"
) -> Weights:
    """Check and load every tensor of the checkpoint in ``folder``.

    Args:
        folder: the checkpoint folder.
        config: its configuration.
        progress: called with the fraction of bytes read so far (0 to 1).
        residency: "fp32" (every matrix a float32 array, q/k/v and gate/up
            fused by copying) or "bf16" (matrices stay bf16 bits, memory-mapped
            when stored as bf16, as :class:`Bf16Matrix`; vectors are float32).

    Raises:
        ModelLoadError: naming the file or tensor at fault.
    """
    if residency not in RESIDENCIES:
        raise ModelLoadError(f"weights residency must be one of {', '.join(RESIDENCIES)}, got {residency!r}")
    checkpoint = SafetensorsCheckpoint(folder)
    check_tensors(checkpoint, config)
    return assemble_resident(config, CheckpointReader(checkpoint, progress), residency, set(checkpoint.tensors))


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


def assemble_resident(config: ModelConfig, reader: CheckpointReader, residency: str, names: set[str],
                      rename: Callable[[str], str] = lambda name: name) -> Weights:
    """Build :class:`Weights` held as ``residency`` says from a checked checkpoint.

    Args:
        config: the decoder's configuration.
        reader: the checkpoint.
        residency: "fp32" or "bf16" (see :func:`load_weights`).
        names: every decoder tensor name present, as Qwen3 spells it.
        rename: a Qwen3 tensor name as this checkpoint spells it.
    """
    if residency == "bf16":
        rounded = sorted({i.dtype for i in reader.checkpoint.tensors.values()} - {"BF16"})
        if rounded:
            log.warning("%s: %s weights are rounded to bf16 once at load (weights=bf16)", reader.checkpoint.folder,
                        "/".join(rounded))
        return _assemble(config, names, _Bf16Source(lambda n: reader.read(rename(n)),
                                                    lambda n: reader.read_bf16(rename(n))))
    return assemble_weights(config, lambda n: reader.read(rename(n)), names,
                            lambda n, out: reader.read_into(rename(n), out))


def resolve_residency(folder: Path | None, requested: str, available_bytes: int | None = None,
                      fp32_bytes: int | None = None) -> str:
    """The residency to load with: ``requested`` unless "auto".

    "auto" picks "bf16" when the float32 weights would take more than
    AUTO_FP32_SHARE of the memory available now (MemAvailable), else "fp32".

    Args:
        folder: the checkpoint folder (only its headers are read), unless ``fp32_bytes`` is given.
        requested: "auto", "fp32" or "bf16".
        available_bytes: memory available (default: /proc/meminfo's MemAvailable).
        fp32_bytes: the weights' size in float32 (default: from the folder's headers).
    """
    if requested in RESIDENCIES:
        return requested
    if requested != "auto":
        raise ModelLoadError(f"weights must be one of auto, {', '.join(RESIDENCIES)}, got {requested!r}")
    if fp32_bytes is None:
        infos = SafetensorsCheckpoint(folder).tensors.values()
        fp32_bytes = sum(info.nbytes // _STORAGE_ITEMSIZE[info.dtype] * 4 for info in infos)
    available = _mem_available() if available_bytes is None else available_bytes
    choice = "bf16" if available is not None and fp32_bytes > AUTO_FP32_SHARE * available else "fp32"
    log.info("weights=auto chose %s: fp32 weights %.2f GiB, memory available %s", choice, fp32_bytes / 2**30,
             "unknown" if available is None else f"{available / 2**30:.2f} GiB")
    return choice


# fp32 weights may take this share of available memory under weights=auto; the rest is KV cache and headroom.
AUTO_FP32_SHARE = 0.7
_STORAGE_ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2}


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


ReadInto = Callable[[str, np.ndarray], None]


class _Fp32Source:
    """float32 matrices; stacked ones are copied into one new array (their parts are views of it)."""

    def __init__(self, read: Callable[[str], np.ndarray], read_into: ReadInto) -> None:
        self.vector = self.matrix = read
        self._read_into = read_into

    def stacked(self, parts: list[tuple[str, int]], *tail: int) -> tuple[np.ndarray, list[np.ndarray]]:
        out = np.empty((sum(rows for _, rows in parts), *tail), dtype=np.float32)  # [sum(rows), *tail]
        views, start = [], 0
        for name, rows in parts:
            self._read_into(name, out[start : start + rows])
            views.append(out[start : start + rows])
            start += rows
        out.flags.writeable = False
        return out, views

    def expert(self, gate_up: np.ndarray, down: np.ndarray) -> DenseMLP:
        return DenseMLP.fused(gate_up, down)


class _Bf16Source:
    """bf16-bit matrices (memory-mapped when stored as bf16); stacking only lists the parts."""

    def __init__(self, read: Callable[[str], np.ndarray], read_bf16: Callable[[str], np.ndarray]) -> None:
        self.vector = read
        self._read_bf16 = read_bf16

    def matrix(self, name: str) -> Bf16Matrix:
        return Bf16Matrix((self._read_bf16(name),))

    def stacked(self, parts: list[tuple[str, int]], *tail: int) -> tuple[Matrix, list[Matrix]]:
        if not tail:  # biases are small: plain float32
            return _Fp32Source(self.vector, _copy_into(self.vector)).stacked(parts)
        bits = [self._read_bf16(name) for name, _ in parts]  # each [rows_i, in]
        return Bf16Matrix(tuple(bits)), [Bf16Matrix((b,)) for b in bits]

    def expert(self, gate_up: np.ndarray, down: np.ndarray) -> DenseMLP:
        inter = gate_up.shape[0] // 2
        return DenseMLP(gate_proj=Bf16Matrix((gate_up[:inter],)), up_proj=Bf16Matrix((gate_up[inter:],)),
                        down_proj=Bf16Matrix((down,)), gate_up_proj=Bf16Matrix((gate_up,)))


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
    return _assemble(config, names, _Fp32Source(read, read_into or _copy_into(read)))


def _assemble(config: ModelConfig, names: set[str], source) -> Weights:
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
    if layout == "fused":
        gate_up = source.matrix(p + "mlp.experts.gate_up_proj")  # [n_experts, 2*moe_inter, hidden]
        down = source.matrix(p + "mlp.experts.down_proj")  # [n_experts, hidden, moe_inter]
        if isinstance(gate_up, Bf16Matrix):
            gate_up, down = gate_up.parts[0].data, down.parts[0].data  # bits, [n_experts, ...]
        experts = tuple(source.expert(gate_up[j], down[j]) for j in range(config.num_experts))
    else:
        e = p + "mlp.experts."
        experts = tuple(_load_mlp(source, f"{e}{j}.", inter, h) for j in range(config.num_experts))
    return SparseMoE(router=router, experts=experts)
