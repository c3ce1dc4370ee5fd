"""Decoder layers over one sequence's prefill chunk held packed (kestrel_trio._kernels.packed_rows).

Theory of operation: on the chunk kernel's CPUs (Intel's AVX-512) a float32
product packs its activations into blocks of 32 tokens and gathers its sums
back into rows. Here the residual stream stays packed, [T/32, hidden, 32],
from the embeddings to the last layer, and every layer goes:

1. the input norm, packed (a token a lane);
2. the q/k/v product, in rows [T, q/k/v]: the one pass over them
   (kestrel_trio._model.chunk_attention) and attention read rows;
3. attention's output packed, o_proj's product packed, added to the stream;
4. the post-attention norm, gate/up's product, SwiGLU and down's product,
   all packed (SwiGLU is elementwise: a block's gate rows then up rows are
   its row of gate, then up), down's added to the stream.

Three of a layer's four products store their sums whole (no staging, no
gather) and none packs its input. The tokens padding the last block are
zeros that stay apart from the others (a lane's sums are its own token's).
Taken for a chunk of one sequence whose padding to whole blocks adds at most
a sixteenth, when every layer's weights are float32 arrays the kernel takes,
the MLP dense with gate and up fused, q/k/v fused, the cache float32, and
prefill products float32. The forward pass runs the last layer on rows when
it trims it to the rows whose logits are wanted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from kestrel_trio import _kernels
from kestrel_trio._kernels import packed_rows
from kestrel_trio._model.chunk_attention import chunk_attention
from kestrel_trio._model.kv_cache import KVCache
from kestrel_trio._model.layers import swiglu
from kestrel_trio._model.matmul import CHUNK_KERNEL_MAX_ROWS, SMALL_BATCH_ROWS, prefill_precision, run_shared, shares_of
from kestrel_trio._model.weights import DenseMLP, Layer

if TYPE_CHECKING:
    from kestrel_trio._model.forward import Decoder

__all__ = ["takes_packed", "packed_layers"]


def takes_packed(layers: Sequence[Layer], caches: Sequence[KVCache], lengths: Sequence[int]) -> bool:
    """Whether a forward pass over ``lengths`` (one segment) runs ``layers`` packed (the module's docstring)."""
    if len(lengths) != 1 or not SMALL_BATCH_ROWS[1] < lengths[0] <= CHUNK_KERNEL_MAX_ROWS:
        return False
    t = lengths[0]
    if -(-t // packed_rows.LANES) * packed_rows.LANES - t > t // 16 or prefill_precision() != "fp32":
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
                and w.shape[0] >= _kernels.CHUNK_WEIGHT_ROWS and w.shape[1] % _kernels.CHUNK_K_STEP == 0 for w in weights)
            and all(n.dtype == np.float32 and n.flags.c_contiguous for n in norms))


def packed_layers(decoder: Decoder, x: np.ndarray, cos: np.ndarray, sin: np.ndarray, cache: KVCache,
                  stop: int) -> tuple[np.ndarray, int]:
    """Layers [0, ``stop``) over a chunk's rows ``x`` [T, hidden] (:func:`takes_packed` said yes), packed.

    Every token's keys and values go into ``cache``. Returns the rows after the last layer run, [T, hidden], and
    the index of the next layer: ``stop``, or the layer whose attention could not take its one pass (nothing of
    it written; the caller goes on from there in rows).
    """
    c, layers = decoder.config, decoder.weights.layers
    t = x.shape[0]
    blocks = -(-t // packed_rows.LANES)
    stream = packed_rows.pack(x, blocks)  # [B, hidden, 32]
    for index in range(stop):
        layer = layers[index]
        a, mlp = layer.attn, layer.mlp
        h = packed_rows.rms_norm(stream, layer.input_layernorm, c.rms_norm_eps)  # [B, hidden, 32]
        qkv = packed_rows.product_rows(h, a.qkv_proj, run_shared, shares_of)[:t]  # [T, (n_heads + 2*n_kv)*hd]
        if a.qkv_bias is not None:
            qkv += a.qkv_bias
        attended = chunk_attention(c, a, index, qkv, cos, sin, cache, t)  # [T, n_heads*head_dim]
        if attended is None:
            return packed_rows.unpack(stream, t), index
        stream += _product(attended, a.o_proj, a.o_bias, blocks)  # [B, hidden, 32]
        h = packed_rows.rms_norm(stream, layer.post_attention_layernorm, c.rms_norm_eps)  # [B, hidden, 32]
        gate_up = _product(h, mlp.gate_up_proj, mlp.gate_up_bias)  # [B, 2*inter, 32]
        inter = gate_up.shape[1] // 2
        act = swiglu(gate_up.reshape(blocks, -1)).reshape(blocks, inter, packed_rows.LANES)  # [B, inter, 32]
        stream += _product(act, mlp.down_proj, mlp.down_bias)  # [B, hidden, 32]
    return packed_rows.unpack(stream, t), stop


def _product(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, blocks: int = 0) -> np.ndarray:
    """``x`` packed [B, K, 32] (or rows [T, K] in ``blocks`` blocks) times ``w`` [N, K] transposed, plus ``bias``
    [N], packed: [B, N, 32]."""
    out = (packed_rows.product_of_rows(x, blocks, w, run_shared, shares_of) if x.ndim == 2
           else packed_rows.product(x, w, run_shared, shares_of))  # [B, N, 32]
    if bias is not None:
        out += bias[None, :, None]
    return out
