"""Decoder layers over one sequence's prefill chunk held packed (kestrel_trio._kernels.x86.float32.packed_rows).

Theory of operation: on the chunk kernel's CPUs (Intel's AVX-512) a float32
product packs its activations into blocks of 32 tokens and gathers its sums
back into rows. Here the residual stream stays packed, [T/32, hidden, 32],
from the embeddings to the last layer, and every layer goes:

1. the q/k/v product of the normed stream, in rows [T, q/k/v]: the one pass
   over them (kestrel_trio._model.decoder.chunk_attention) and attention read rows;
2. o_proj's product of attention's output (each thread packing its own
   blocks of it), added to the stream, which is normed;
3. gate/up's product and SwiGLU, down's product added to the stream, which
   is normed for the next layer's q/k/v.

Three of a layer's four products store their sums whole (no staging, no
gather) and none packs its input on one thread. What follows a product token
by token (the residual sum, the norm, SwiGLU) runs in the product's own
tasks on the blocks each has just written: shared between the threads
without a hand-off of its own (run apart from the products, one norm or
SwiGLU a hand-off, sharing them gained nothing). The tokens padding the last
block are zeros that stay apart from the others (a lane's sums are its own
token's).

Taken for a chunk of one sequence whose padding to whole blocks adds at
most a sixteenth, when every layer's weights are float32 arrays the kernel
takes, the MLP dense with gate and up fused, q/k/v fused, the cache float32,
and prefill products float32. The forward pass runs the last layer on rows
when it trims it to the rows whose logits are wanted.

Measured on the 2-core Xeon with AMX (Qwen3-0.6B's shapes),
whole prefills alternated with the layers over rows ten times in one
process: 512 tokens 1444-1618 ms against 1532-1734, 256 tokens 683-764
against 743-792, 128 tokens 389-412 against 409-430.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from kestrel_trio import _kernels
from kestrel_trio._kernels.x86.float32 import packed_rows
from kestrel_trio._model.decoder.chunk_attention import chunk_attention
from kestrel_trio._model.checkpoints.config import ModelConfig
from kestrel_trio._model.cache.kv_cache import KVCache
from kestrel_trio._model.products.backend import current
from kestrel_trio._model.products.matmul import CHUNK_KERNEL_MAX_ROWS, SMALL_BATCH_ROWS, run_shared, shares_of
from kestrel_trio._model.weights.assemble import DenseMLP, Layer

__all__ = ["takes_packed", "packed_layers"]


def takes_packed(layers: Sequence[Layer], caches: Sequence[KVCache], lengths: Sequence[int]) -> bool:
    """Whether a forward pass over ``lengths`` (one segment) runs ``layers`` packed (the module's docstring)."""
    if len(lengths) != 1 or not SMALL_BATCH_ROWS[1] < lengths[0] <= CHUNK_KERNEL_MAX_ROWS:
        return False
    t = lengths[0]
    if -(-t // packed_rows.LANES) * packed_rows.LANES - t > t // 16 or current().prefill_precision != "fp32":
        return False
    if caches[0].float32_buffers(0) is None or _kernels.enable_chunk_products() is not None:
        return False
    return all(_layer_takes(layer) for layer in layers)


def _layer_takes(layer: Layer) -> bool:
    mlp, attn = layer.mlp, layer.attn
    if not isinstance(mlp, DenseMLP) or mlp.gate_up_proj is None or attn.qkv_proj is None:
        return False
    weights = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    norms = (layer.input_layernorm, layer.post_attention_layernorm)
    return (all(type(w) is np.ndarray and w.dtype == np.float32 and w.strides[1] == 4
                and w.shape[0] >= _kernels.CHUNK_WEIGHT_ROWS and w.shape[1] % _kernels.CHUNK_K_STEP == 0
                for w in weights)
            and all(n.dtype == np.float32 and n.flags.c_contiguous for n in norms))


def packed_layers(c: ModelConfig, layers: Sequence[Layer], x: np.ndarray, cos: np.ndarray, sin: np.ndarray,
                  cache: KVCache, stop: int) -> tuple[np.ndarray, int]:
    """Layers [0, ``stop``) of ``layers`` (of the model ``c``) over a chunk's rows ``x`` [T, hidden]
    (:func:`takes_packed` said yes), packed.

    Takes the config and layers rather than the forward pass's decoder, so that this module does not import the
    forward pass that calls it.

    Every token's keys and values go into ``cache``. Returns the rows after the last layer run, [T, hidden], and
    the index of the next layer: ``stop``, or the layer whose attention could not take its one pass (nothing of
    it written; the caller goes on from there in rows).
    """
    t = x.shape[0]
    blocks = -(-t // packed_rows.LANES)
    stream = packed_rows.pack(x, blocks)  # [B, hidden, 32]
    h = packed_rows.rms_norm(stream, layers[0].input_layernorm, c.rms_norm_eps) if stop else None  # [B, hidden, 32]
    for index in range(stop):
        layer = layers[index]
        a, mlp = layer.attn, layer.mlp
        qkv = packed_rows.product_rows(h, a.qkv_proj, run_shared, shares_of)[:t]  # [T, (n_heads + 2*n_kv)*hd]
        if a.qkv_bias is not None:
            qkv += a.qkv_bias
        attended = chunk_attention(c, a, index, qkv, cos, sin, cache, t)  # [T, n_heads*head_dim]
        if attended is None:
            return packed_rows.unpack(stream, t), index
        # Each temporary let go once read: the engine's step budget counts about 4 hidden + q/k/v + 3 inter
        # values a row held at once (kestrel_trio.engine.memory.kv_budget).
        del qkv
        h = np.empty_like(stream)  # [B, hidden, 32]: the post-attention norm's
        then = _add_and_norm(stream, a.o_bias, layer.post_attention_layernorm, c.rms_norm_eps, h)
        packed_rows.product_of_rows(attended, blocks, a.o_proj, run_shared, shares_of, then)
        del attended
        act = np.empty((blocks, mlp.down_proj.shape[1], packed_rows.LANES), dtype=np.float32)  # [B, inter, 32]
        packed_rows.product(h, mlp.gate_up_proj, run_shared, shares_of, _swiglu(mlp.gate_up_bias, act))
        following = layers[index + 1].input_layernorm if index + 1 < stop else None
        h = np.empty_like(stream) if following is not None else None  # [B, hidden, 32]: the next layer's input norm
        then = _add_and_norm(stream, mlp.down_bias, following, c.rms_norm_eps, h)
        packed_rows.product(act, mlp.down_proj, run_shared, shares_of, then)
    return packed_rows.unpack(stream, t), stop


def _add_and_norm(stream: np.ndarray, bias: np.ndarray | None, norm: np.ndarray | None, eps: float,
                  normed: np.ndarray | None) -> packed_rows.Then:
    """The epilogue of a product whose output [B, hidden, 32] plus ``bias`` adds to the residual ``stream``, which
    ``norm`` (if not None) then norms into ``normed``: block by block, in each share's task. The bias goes to the
    output first, as in the layers over rows (``x + (x @ w.T + bias)``): the same roundings."""
    def then(out: np.ndarray, first: int, stop: int) -> None:
        if bias is not None:
            out[first:stop] += bias[None, :, None]
        stream[first:stop] += out[first:stop]  # [blocks, hidden, 32]
        if norm is not None:
            packed_rows.rms_norm(stream, norm, eps, normed, first, stop)
    return then


def _swiglu(bias: np.ndarray | None, act: np.ndarray) -> packed_rows.Then:
    """The epilogue of gate/up's product [B, 2*inter, 32]: plus ``bias``, then silu(gate) * up into ``act``
    [B, inter, 32], block by block, in each share's task."""
    def then(out: np.ndarray, first: int, stop: int) -> None:
        if bias is not None:
            out[first:stop] += bias[None, :, None]
        packed_rows.swiglu(out, act, first, stop)
    return then
