"""The Qwen decoder forward pass over a flat batch of sequence segments.

Theory of operation: a call takes the new tokens of one or more sequences laid
end to end (``token_ids`` [N]), each sequence's segment length, and each
sequence's own KV cache. Every projection runs once over all N rows; only
attention is per segment, against that segment's cache. A prefill chunk is a
segment of many tokens, a decode step a segment of one, and several sequences
stepping together are several segments: batching changes shapes, not code.
Weights fused at load make q/k/v one product and gate/up another; lm_head runs
only on the rows whose logits are returned. Nothing after the last layer reads
its other rows, so that layer writes every row's keys and values to the caches
but computes attention, o_proj and the MLP only for the rows returned (none for a
prompt chunk whose logits nobody wants): 1/num_layers of a prefill's products.
One sequence's prefill chunk runs its layers (all, or all but a trimmed last)
packed where the chunk kernel runs (kestrel_trio._model.decoder.packed_layers). One
sequence's decode step (one new token) with integer products takes a path of
its own, the same logits in far fewer calls (kestrel_trio._model.decoder.decode_step).
"""

from __future__ import annotations

from typing import Sequence

import attrs
import numpy as np

from kestrel_trio._model.products.backend import Backend, current
from kestrel_trio._model.decoder.chunk_attention import chunk_attention
from kestrel_trio._model.checkpoints.config import ModelConfig
from kestrel_trio._model.decoder.decode_step import decode_step
from kestrel_trio._model.cache.kv_cache import KVCache, kv_token_bytes
from kestrel_trio._model.decoder.layers import (
    causal_attention, decode_attentions, dense_mlp, embedding, linear, rms_norm, sparse_moe,
)
from kestrel_trio._model.decoder.packed_layers import packed_layers, takes_packed
from kestrel_trio._model.decoder.rope import Rope, apply_rope
from kestrel_trio._model.weights.assemble import Attention, DenseMLP, Layer, Weights

__all__ = ["Decoder", "RowOverrides", "forward", "feed_chunks"]


@attrs.frozen
class Decoder:
    """Immutable weights, config, rotary tables and kernel settings: everything shared by requests.

    ``backend``: the model's kernel settings (kestrel_trio._model.products.backend), :func:`forward` runs in; by default
    the backend current where the decoder is built (kestrel_trio.model.load_model builds it inside the one its
    arguments make).
    """

    config: ModelConfig
    weights: Weights
    rope: Rope
    backend: Backend = attrs.field(factory=current)

    @classmethod
    def build(cls, config: ModelConfig, weights: Weights) -> "Decoder":
        return cls(config=config, weights=weights, rope=Rope.build(config.rope, config.head_dim))

    def new_cache(self, dtype: str = "fp32", max_tokens: int | None = None) -> KVCache:
        """An empty KV cache for one sequence (storage ``dtype``; at most ``max_tokens``, None: unbounded)."""
        c = self.config
        return KVCache(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, dtype=dtype, max_tokens=max_tokens)

    def kv_token_bytes(self, dtype: str = "fp32") -> int:
        """Bytes one token's keys and values take in a cache of ``dtype`` (all layers)."""
        c = self.config
        return kv_token_bytes(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, dtype)


@attrs.frozen
class RowOverrides:
    """What Qwen3-VL changes in a forward pass over one segment holding image rows.

    Attributes:
        rows: int [n_img], the segment's rows that are image tokens.
        embeds: [n_img, hidden], used instead of those rows' token embeddings.
        deepstack: each [n_img, hidden], added to those rows after decoder layer i.
        cos_sin: the rotary angles' cos and sin, each [N, head_dim/2] (3-D M-RoPE),
            used instead of those of ``positions``.
    """

    rows: np.ndarray
    embeds: np.ndarray
    deepstack: tuple[np.ndarray, ...]
    cos_sin: tuple[np.ndarray, np.ndarray]


def forward(
    decoder: Decoder,
    token_ids: np.ndarray,
    positions: np.ndarray,
    caches: Sequence[KVCache],
    lengths: Sequence[int],
    *,
    all_logits: bool = False,
    wanted: Sequence[bool] | None = None,
    overrides: RowOverrides | None = None,
    hidden: bool = False,
) -> np.ndarray:
    """Run the decoder over new tokens of one or more sequences, extending their caches.

    Args:
        decoder: the model.
        token_ids: [N] int, the segments' tokens end to end.
        positions: [N] int, each token's position in its sequence.
        caches: one KV cache per segment; each is extended by its segment.
        lengths: tokens per segment; they sum to N.
        all_logits: logits for every row (True) or only each segment's last row.
        wanted: per segment, whether its last row's logits are returned (a prompt chunk
            before the last needs none); None: every segment's. Ignored with ``all_logits``.
        overrides: image rows of a single segment (Qwen3-VL); None for text.
        hidden: return the final hidden states (after the final norm, before lm_head) instead of
            logits: the rows embeddings are pooled from.

    Returns:
        float32 logits, [N, vocab] if ``all_logits``, else one row per wanted segment
        ([len(lengths), vocab] when ``wanted`` is None); with ``hidden``, the same rows of
        [.., hidden_size] instead.
    """
    with decoder.backend.active():  # the products below take this model's settings, whatever another model's are
        return _forward(decoder, token_ids, positions, caches, lengths, all_logits, wanted, overrides, hidden)


def _forward(decoder: Decoder, token_ids: np.ndarray, positions: np.ndarray, caches: Sequence[KVCache],
             lengths: Sequence[int], all_logits: bool, wanted: Sequence[bool] | None, overrides: RowOverrides | None,
             hidden: bool) -> np.ndarray:
    if (overrides is None and not hidden and len(lengths) == 1 and int(lengths[0]) == 1
            and (all_logits or wanted is None or wanted[0])):  # (the one-token step gives logits, never hidden rows)
        logits = decode_step(decoder, int(token_ids[0]), int(positions[0]), caches[0])  # [1, vocab]
        if logits is not None:  # one sequence's decode step, on its own path (kestrel_trio._model.decoder.decode_step)
            return logits
    c = decoder.config
    w = decoder.weights
    x = embedding(w.embed_tokens, token_ids)  # [N, hidden] (a new array)
    if overrides is None:
        cos, sin = decoder.rope.cos_sin(positions)  # [N, head_dim/2] each
    else:
        x[overrides.rows] = overrides.embeds  # [n_img, hidden]
        cos, sin = overrides.cos_sin  # [N, head_dim/2] each
    for cache, n in zip(caches, lengths):
        cache.reserve(n)
    lengths = [int(n) for n in lengths]
    tails = None if all_logits else _output_tails(lengths, wanted)  # None: every row's logits
    last = len(w.layers) - 1
    trimmed = tails is not None and tails != lengths and not (overrides is not None and last < len(overrides.deepstack))
    start = 0
    if overrides is None and takes_packed(w.layers, caches, lengths):  # a chunk of one sequence, packed
        x, start = packed_layers(c, w.layers, x, cos, sin, caches[0], last if trimmed else last + 1)  # [N, hidden]
    for index in range(start, last + 1):
        layer = w.layers[index]
        x = _layer(decoder, layer, index, x, cos, sin, caches, lengths, tails if trimmed and index == last else None)
        if overrides is not None and index < len(overrides.deepstack):
            x[overrides.rows] += overrides.deepstack[index]  # [n_img, hidden]
    for cache, n in zip(caches, lengths):
        cache.commit(n)
    if tails is not None and not trimmed:
        x = x[_tail_rows(lengths, tails)]  # [rows, hidden]
    if x.shape[0] == 0:
        width = c.hidden_size if hidden else w.lm_head.shape[0]
        return np.empty((0, width), dtype=np.float32)  # [0, vocab or hidden]: no rows wanted
    x = rms_norm(x, w.norm, c.rms_norm_eps)  # [rows, hidden]
    if hidden:
        return x  # [rows, hidden]
    return linear(x, w.lm_head)  # [rows, vocab]


def feed_chunks(decoder: Decoder, cache: KVCache, token_ids: np.ndarray, chunk: int) -> np.ndarray:
    """Feed ``token_ids`` [T] (T >= 1) of one sequence in forward passes of ``chunk`` tokens; the last one's logits.

    The chunks before the last ask for no logits, so their last layer computes only keys and values.
    On an error, ``cache`` holds the chunks fed before it (its length says how many tokens).

    Returns:
        float32 logits [vocab] of the last token.
    """
    if token_ids.size == 0:
        raise ValueError("feeding needs at least one token")
    cache.reserve(token_ids.size)  # the whole prompt at once, as the engine does: no copy as the cache grows
    last = (token_ids.size - 1) // chunk * chunk  # where the last chunk starts
    for start in range(0, token_ids.size, chunk):
        piece = token_ids[start : start + chunk]  # [<= chunk]
        positions = np.arange(cache.length, cache.length + piece.size, dtype=np.int64)  # [<= chunk]
        logits = forward(decoder, piece, positions, [cache], [piece.size], wanted=[start == last])  # [1 or 0, vocab]
    return logits[0]


def _output_tails(lengths: Sequence[int], wanted: Sequence[bool] | None) -> list[int]:
    """Per segment, how many of its last rows' logits are returned: 1, or 0 where ``wanted`` says no (or it is empty)."""
    return [int(n > 0 and (wanted is None or bool(wanted[i]))) for i, n in enumerate(lengths)]


def _tail_rows(lengths: Sequence[int], tails: Sequence[int]) -> np.ndarray:
    """Flat indices [sum(tails)] of the last ``tails[i]`` rows of each segment ``i`` of ``lengths``."""
    ends = np.cumsum(lengths)  # [n_segments]
    return np.concatenate([np.arange(end - tail, end) for end, tail in zip(ends, tails)] + [np.empty(0, np.int64)])


def _layer(decoder: Decoder, layer: Layer, index: int, x: np.ndarray, cos: np.ndarray, sin: np.ndarray,
           caches: Sequence[KVCache], lengths: Sequence[int], tails: Sequence[int] | None) -> np.ndarray:
    """One decoder layer over ``x`` [N, hidden]: every row out, or (``tails``) each segment's last few [R, hidden]."""
    c = decoder.config
    h = rms_norm(x, layer.input_layernorm, c.rms_norm_eps)  # [N, hidden]
    attended = _attention(c, layer.attn, index, h, cos, sin, caches, lengths, tails)  # [R, hidden]
    x = (x if tails is None else x[_tail_rows(lengths, tails)]) + attended  # [R, hidden]
    h = rms_norm(x, layer.post_attention_layernorm, c.rms_norm_eps)  # [R, hidden]
    if isinstance(layer.mlp, DenseMLP):
        return x + dense_mlp(h, layer.mlp)  # [R, hidden]
    return x + sparse_moe(h, layer.mlp, c.num_experts_per_tok, c.norm_topk_prob)  # [R, hidden]


def _attention(c: ModelConfig, a: Attention, index: int, h: np.ndarray, cos: np.ndarray, sin: np.ndarray,
               caches: Sequence[KVCache], lengths: Sequence[int], tails: Sequence[int] | None) -> np.ndarray:
    """Every row's keys and values into the caches; the attention output [R, hidden] of every row or of the tails."""
    tails = lengths if tails is None else tails
    qkv = linear(h, a.qkv_proj, a.qkv_bias) if a.qkv_proj is not None else None  # [N, (n_heads + 2*n_kv)*hd]
    if qkv is not None and len(caches) == 1 and lengths[0] > 1:  # a chunk of one sequence: one pass, if it can
        out = chunk_attention(c, a, index, qkv, cos, sin, caches[0], tails[0])  # [tail, n_heads*head_dim]
        if out is not None:
            return linear(out, a.o_proj, a.o_bias)  # [tail, hidden]
    q, k, v = _qkv(c, a, h) if qkv is None else _split_qkv(c, qkv)
    if a.q_norm is not None:
        q = rms_norm(q, a.q_norm, c.rms_norm_eps)  # [N, n_heads, head_dim]
        k = rms_norm(k, a.k_norm, c.rms_norm_eps)  # [N, n_kv, head_dim]
    q = apply_rope(q, cos, sin)  # [N, n_heads, head_dim]
    k = apply_rope(k, cos, sin)  # [N, n_kv, head_dim]
    out = np.empty((sum(tails), c.num_attention_heads * c.head_dim), dtype=np.float32)  # [R, n_heads*head_dim]
    if len(caches) > 1 and all(length == 1 == tail for length, tail in zip(lengths, tails)):  # a batched decode step
        stored = [cache.write(index, k[i : i + 1], v[i : i + 1]) for i, cache in enumerate(caches)]
        decode_attentions(q, stored, c.head_dim**-0.5, out)
    else:
        start = row = 0
        for cache, length, tail in zip(caches, lengths, tails):
            rows = slice(start, start + length)
            keys, values = cache.write(index, k[rows], v[rows])  # [n_kv, past+T, head_dim] each
            if tail:  # the segment's last ``tail`` queries, after the keys of every token before them
                queries = q[start + length - tail : start + length]  # [tail, n_heads, head_dim]
                out[row : row + tail] = causal_attention(queries, keys, values, cache.length + length - tail,
                                                         c.head_dim**-0.5)
            start += length
            row += tail
    return linear(out, a.o_proj, a.o_bias)  # [R, hidden]


def _qkv(c: ModelConfig, a: Attention, h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Queries, keys and values of ``h`` [N, hidden] from separate q, k and v weights."""
    n, hd = h.shape[0], c.head_dim
    q = linear(h, a.q_proj, a.q_bias)  # [N, n_heads*head_dim]
    k = linear(h, a.k_proj, a.k_bias)  # [N, n_kv*head_dim]
    v = linear(h, a.v_proj, a.v_bias)  # [N, n_kv*head_dim]
    return (
        q.reshape(n, c.num_attention_heads, hd),  # [N, n_heads, head_dim]
        k.reshape(n, c.num_key_value_heads, hd),  # [N, n_kv, head_dim]
        v.reshape(n, c.num_key_value_heads, hd),  # [N, n_kv, head_dim]
    )


def _split_qkv(c: ModelConfig, qkv: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Queries, keys and values as views of a fused product ``qkv`` [N, (n_heads + 2*n_kv)*head_dim]."""
    n, hd = qkv.shape[0], c.head_dim
    q_end = c.num_attention_heads * hd
    k_end = q_end + c.num_key_value_heads * hd
    return (
        qkv[:, :q_end].reshape(n, c.num_attention_heads, hd),  # [N, n_heads, head_dim]
        qkv[:, q_end:k_end].reshape(n, c.num_key_value_heads, hd),  # [N, n_kv, head_dim]
        qkv[:, k_end:].reshape(n, c.num_key_value_heads, hd),  # [N, n_kv, head_dim]
    )
