"""The numpy building blocks of a Qwen decoder layer, float32 throughout.

Matrices are float32 arrays, or :class:`~kestrel_trio._model.forms.packed.PackedMatrix`
(bf16 bits, a GGUF's blocks, int8, int4) that :func:`linear`
(kestrel_trio._model.products.matmul) expands a chunk at a time at each product.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from kestrel_trio import _kernels
from kestrel_trio._model.cache.kv_storage import attend_stored, mask_future, softmax_numerators
from kestrel_trio._model.products.matmul import linear, one_thread_blas, run_shared, shares_of
from kestrel_trio._model.forms.packed import Matrix, PackedMatrix
from kestrel_trio._model.weights.assemble import DenseMLP, SparseMoE

__all__ = ["rms_norm", "linear", "embedding", "silu", "swiglu", "causal_attention", "decode_attentions", "dense_mlp",
           "sparse_moe"]


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """Root-mean-square norm over the last axis of ``x`` [..., d] with ``weight`` [d].

    x * rsqrt(mean(x^2) + eps), as transformers computes it. In one compiled
    call where numba runs (kestrel_trio._kernels.portable.norm): a decode step's few
    rows cost numpy's five calls more in dispatch than in arithmetic, and a
    prefill chunk's are 3-4x faster in one pass (Qwen3-0.6B's shapes, 256
    rows, 2-core Zen 5: hidden 33 against 114 us, query heads 77 against 316).
    Otherwise the sum of squares by einsum and one output array (8x faster
    than np.mean(np.square(x)) here).
    """
    fused = _kernels.rms_norm(x, weight, eps)  # [..., d]; None for other dtypes or ranks
    if fused is not None:
        return fused
    squares = np.einsum("...i,...i->...", x, x)[..., None]  # [..., 1]
    scale = np.float32(1.0) / np.sqrt(squares / np.float32(x.shape[-1]) + np.float32(eps))  # [..., 1]
    out = x * scale  # [..., d]
    out *= weight
    return out


def embedding(table: Matrix, ids: np.ndarray) -> np.ndarray:
    """float32 rows ``ids`` [N] of an embedding ``table`` [vocab, hidden], [N, hidden]."""
    return table.rows(ids) if isinstance(table, PackedMatrix) else table[ids]


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), elementwise."""
    return x / (np.float32(1.0) + np.exp(-x))


def causal_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, past: int, scale: float,
                     shared: bool = True) -> np.ndarray:
    """Grouped-query attention of new queries over a sequence's cached keys.

    Args:
        q: [T, n_heads, head_dim], the queries of the T newest tokens.
        keys: [n_kv, past + T, head_dim], every key of the sequence so far (float32, or
            a KV cache's bf16 bits / float16, widened as read: kestrel_trio._model.cache.kv_storage).
        values: [n_kv, past + T, head_dim], stored as ``keys``.
        past: tokens before the new ones.
        scale: the score multiplier (head_dim ** -0.5).
        shared: whether a long one may be shared among the product threads (False inside a task
            that already runs on them: :func:`decode_attentions`).

    Returns:
        [T, n_heads * head_dim]; query head h reads key/value head h // (n_heads / n_kv).
    """
    t, n_heads, head_dim = q.shape
    if t == 1:  # a decode step: one compiled call where numba runs and the cache is float32
        sharing = (run_shared, shares_of) if shared and keys.shape[1] * n_heads >= SHARED_DECODE_SCORES else ()
        fused = _kernels.decode_attention(q[0], keys, values, scale, *sharing)  # [n_heads*head_dim]
        if fused is not None:
            return fused.reshape(1, -1)
    n_kv, total, _ = keys.shape
    if t >= CHUNK_ATTENTION_MIN_QUERIES:  # a prefill chunk's: one compiled call a kv head where its assembly runs
        # (x86-64 with AVX-512 or AVX2; a float32 cache), shared among the product threads from SHARED_ATTENTION_SCORES
        sharing = (run_shared, shares_of) if shared and t * total * n_heads >= SHARED_ATTENTION_SCORES else (None, None)
        fused = _kernels.prefill_attention(q, keys, values, past, scale, *sharing)  # [T, n_heads*head_dim]
        if fused is not None:
            return fused
    group = n_heads // n_kv
    scaled = q * np.float32(scale)  # [T, n_heads, head_dim]: fewer multiplies than scaling the scores
    # Rows in (query, group) order, so that a block of queries is a run of rows.
    grouped = scaled.reshape(t, n_kv, group, head_dim).transpose(1, 0, 2, 3)  # [n_kv, T, group, head_dim]
    grouped = grouped.reshape(n_kv, t * group, head_dim)  # [n_kv, T*group, head_dim]
    out = np.empty((n_kv, t * group, head_dim), dtype=np.float32)  # [n_kv, T*group, head_dim]
    if not shared or t * total * n_heads < SHARED_ATTENTION_SCORES:
        # A speculative verify step or a short chunk: each product is small, but big enough that OpenBLAS
        # would hand it to its own threads, and waking them cost 2.2 s a 9-row step of SmolLM2 at 781 tokens
        # of context on a busy machine (0.29 s on one thread). Woken, they also spin on after it, taking the
        # cores the next shared product needs.
        with one_thread_blas():
            _attend_blocks(grouped, keys, values, past, t, out)
    else:  # a prefill chunk: the kv heads shared among the product threads, softmax passes included
        run_shared([lambda a=a, b=b: _attend_blocks(grouped[a:b], keys[a:b], values[a:b], past, t, out[a:b])
                    for a, b in shares_of(n_kv)])
    out = out.reshape(n_kv, t, group, head_dim).transpose(1, 0, 2, 3)  # [T, n_kv, group, head_dim]
    return out.reshape(t, n_heads * head_dim)  # [T, n_heads*head_dim]


def decode_attentions(q: np.ndarray, stored: Sequence[tuple[np.ndarray, np.ndarray]], scale: float,
                      out: np.ndarray) -> None:
    """One query each of several sequences (a batched decode step) over its own cache, into rows of ``out``.

    Args:
        q: [B, n_heads, head_dim], sequence i's query in row i.
        stored: per sequence, its keys and values, each [n_kv, total, head_dim] (as :func:`causal_attention`).
        scale: the score multiplier (head_dim ** -0.5).
        out: [B, n_heads * head_dim], written.

    From SHARED_DECODE_SCORES query-head x key scores in all, the sequences are
    shared among the product threads, each thread taking a run of them with
    about half the keys; else they run here in turn, a long one sharing its heads.
    float32 caches take one compiled call a sequence (kestrel_trio._kernels.decode_attentions).
    """
    lengths = [keys.shape[1] for keys, _ in stored]
    rows = out.reshape(q.shape)  # [B, n_heads, head_dim], a view
    buffers = _kernels.decode_buffers(q, stored, rows)

    def attend(first: int, stop: int, shared: bool) -> None:
        if buffers is not None:  # no sequence would share its heads: under SHARED_DECODE_SCORES, or one thread
            _kernels.decode_attentions(q, buffers, scale, rows, first, stop)
            return
        for i in range(first, stop):
            out[i] = causal_attention(q[i : i + 1], *stored[i], lengths[i] - 1, scale, shared)[0]  # [n_heads*hd]

    shares = _shares_by_keys(lengths, len(shares_of(len(lengths))))
    if len(shares) < 2 or sum(lengths) * q.shape[1] < SHARED_DECODE_SCORES:
        attend(0, len(lengths), True)
    else:
        run_shared([lambda a=a, b=b: attend(a, b, False) for a, b in shares])


def _shares_by_keys(lengths: Sequence[int], count: int) -> list[tuple[int, int]]:
    """[start, stop) runs of sequences splitting their keys (``lengths``) as evenly as whole sequences allow.

    Each cut is the boundary nearest to its even share of the keys (one long
    sequence among short ones gets a share of its own).
    """
    count = min(count, len(lengths))
    prefix = np.concatenate([[0], np.cumsum(lengths)])  # [n + 1]: keys before each boundary
    edges = [0]
    for k in range(1, count):
        target = prefix[-1] * k / count
        boundaries = range(edges[-1] + 1, len(lengths) - (count - k) + 1)  # leave one sequence a later share
        edges.append(min(boundaries, key=lambda b: abs(prefix[b] - target)))
    edges.append(len(lengths))
    return list(zip(edges[:-1], edges[1:]))


# Queries from which a chunk's attention takes kestrel_trio._kernels.prefill_attention. The kernel packs every key
# and value of each head a call: for a verify step's few queries numpy's way is faster (2-core Xeon, two threads,
# Qwen3-0.6B's heads over 1024 keys: 4 queries 1.14 ms against 0.69, 16 queries 1.90 against 1.45, 32 queries 1.52
# against 2.22; SmolLM2's, 32 queries 0.72 against 0.68, 128 queries 1.67 against 2.40).
CHUNK_ATTENTION_MIN_QUERIES = 32
# Scores (T x total x heads) from which attention is shared among threads: 128 Ki, about half a millisecond
# on one thread. A 128-token chunk of Qwen3-0.6B (256 Ki scores, 1.4 ms a layer alone) gained 4% of its whole
# prefill shared (403-410 ms against 415-431, 2-core Xeon, alternated), 96 tokens 2%, 64 tokens nothing.
SHARED_ATTENTION_SCORES = 1 << 17
# Query-head x key scores from which a decode step's attention is shared among the product threads: 16 heads over
# 256 keys of 128 dims, about 50 us on one thread on the 2-core Zen 5, where a hand-off costs 10-30 us. Measured
# there (Qwen3-0.6B's shapes, best / median of three step times in one process), 8 sequences of 64 keys: 77.6 /
# 78.1 ms from 4 Ki scores, 80.1 / 82.7 from 16 Ki (not shared), 83.1 / 86.2 never shared; 16 of 64: 120.3 /
# 122.0, 123.2 / 123.7, 127.8 / 132.5.
SHARED_DECODE_SCORES = 1 << 12
# Queries a block of a prefill chunk's attention: each block scores only the keys its queries see (the keys
# before the chunk and the chunk's own up to the block's last query), so a causal chunk computes a little
# over half of the scores of the whole square, and a block's scores stay in L2 between their passes.
QUERY_BLOCK = 64
# The causal mask of a block of queries over its own keys: -inf above the diagonal.
_DIAGONAL = np.where(np.arange(QUERY_BLOCK)[None, :] > np.arange(QUERY_BLOCK)[:, None], np.float32(-np.inf),
                     np.float32(0))  # [QUERY_BLOCK, QUERY_BLOCK]


def _attend_blocks(grouped: np.ndarray, keys: np.ndarray, values: np.ndarray, past: int, t: int,
                   out: np.ndarray) -> None:
    """Causal attention of ``grouped`` [h, T*group, head_dim] (T new queries after ``past`` keys), a block at a time."""
    group = grouped.shape[1] // t
    # One buffer for every block's scores: a fresh array a block (2 MiB for 64 queries over 512 keys) cost its
    # pages' faults and zeroing each time.
    scratch = (np.empty(grouped.shape[0] * min(QUERY_BLOCK, t) * group * (past + t), dtype=np.float32)
               if keys.dtype == np.float32 else None)  # stored keys: attend_stored has its own buffers
    for first in range(0, t, QUERY_BLOCK):
        last = min(first + QUERY_BLOCK, t)
        rows = slice(first * group, last * group)
        seen = past + last  # keys the block's queries see, at most
        diagonal = _DIAGONAL[: last - first, : last - first] if last - first > 1 else None
        _attend(grouped[:, rows], keys[:, :seen], values[:, :seen], diagonal, out[:, rows], scratch)


def _attend(grouped: np.ndarray, keys: np.ndarray, values: np.ndarray, diagonal: np.ndarray | None,
            out: np.ndarray, scratch: np.ndarray | None = None) -> None:
    """Softmax attention of ``grouped`` [h, B*group, head_dim] over ``keys``, ``values`` [h, seen, head_dim].

    ``diagonal`` [B, B] masks the last B keys for the B queries (:func:`mask_future`), None for one query;
    ``scratch``: float32, at least h * B*group * seen, for the scores of float32 keys (None: a new array).
    """
    if keys.dtype != np.float32:
        attend_stored(grouped, keys, values, diagonal, out)
        return
    h, rows, seen = grouped.shape[0], grouped.shape[1], keys.shape[1]
    if scratch is None:
        scratch = np.empty(h * rows * seen, dtype=np.float32)
    scores = scratch[: h * rows * seen].reshape(h, rows, seen)  # [h, B*group, seen], C-contiguous
    np.matmul(grouped, keys.transpose(0, 2, 1), out=scores)
    mask_future(scores, diagonal)
    sums = softmax_numerators(scores)  # [h, B*group, 1]
    np.matmul(scores, values, out=out)  # [h, B*group, head_dim]
    out /= sums  # normalising the output: head_dim / total of the divisions


def dense_mlp(x: np.ndarray, mlp: DenseMLP) -> np.ndarray:
    """SwiGLU: down(silu(gate(x)) * up(x)) for ``x`` [N, hidden], plus the biases when it has them."""
    if mlp.gate_up_proj is None:
        gate = silu(linear(x, mlp.gate_proj, mlp.gate_bias))  # [N, inter]
        gate *= linear(x, mlp.up_proj, mlp.up_bias)  # [N, inter]
        return linear(gate, mlp.down_proj, mlp.down_bias)  # [N, hidden]
    gate_up = linear(x, mlp.gate_up_proj, mlp.gate_up_bias)  # [N, 2*inter]
    return linear(swiglu(gate_up), mlp.down_proj, mlp.down_bias)  # [N, hidden]


def swiglu(gate_up: np.ndarray) -> np.ndarray:
    """silu(gate) * up in one fresh array [N, inter], for ``gate_up`` [N, 2*inter] holding gate, then up.

    In one compiled pass where numba runs (kestrel_trio._kernels.swiglu: its exponential within about an ulp
    of numpy's), else as ``silu(gate) * up`` rounds in numpy.
    """
    fused = _kernels.swiglu(gate_up)  # [N, inter]
    if fused is not None:
        return fused
    inter = gate_up.shape[1] // 2
    gate, up = gate_up[:, :inter], gate_up[:, inter:]  # [N, inter] each
    out = np.negative(gate)  # [N, inter]
    np.exp(out, out=out)
    out += np.float32(1.0)
    np.divide(gate, out, out=out)
    out *= up
    return out


def sparse_moe(x: np.ndarray, moe: SparseMoE, top_k: int, norm_topk_prob: bool) -> np.ndarray:
    """Qwen3-MoE block: softmax router, top-k experts per token, weighted sum.

    Args:
        x: [N, hidden].
        moe: router and experts.
        top_k: experts per token (num_experts_per_tok).
        norm_topk_prob: renormalise the chosen experts' probabilities to sum to 1.
    """
    logits = linear(x, moe.router)  # [N, n_experts]
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))  # [N, n_experts]
    probs /= probs.sum(axis=-1, keepdims=True)
    chosen = np.argsort(-probs, axis=-1, kind="stable")[:, :top_k]  # [N, top_k]
    weights = np.take_along_axis(probs, chosen, axis=-1)  # [N, top_k]
    if norm_topk_prob:
        weights /= weights.sum(axis=-1, keepdims=True)
    out = np.zeros_like(x)  # [N, hidden]
    for expert in np.unique(chosen):
        rows, slot = np.nonzero(chosen == expert)  # [M], [M]
        contribution = dense_mlp(x[rows], moe.experts[expert])  # [M, hidden]
        out[rows] += contribution * weights[rows, slot][:, None]  # rows are unique per expert
    return out
