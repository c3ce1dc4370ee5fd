"""The numpy building blocks of a Qwen decoder layer, float32 throughout.

Matrices are float32 arrays, or :class:`Bf16Matrix` bf16 bits that
:func:`linear` upcasts (exactly) chunk by chunk just before each product.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time

import numpy as np

from kestrel_trio._model.weights import Bf16Matrix, DenseMLP, Matrix, SparseMoE

__all__ = [
    "rms_norm", "linear", "linear_bf16", "set_upcast_workers", "embedding", "small_batch_call", "set_small_batch_call",
    "silu", "swiglu", "causal_attention", "dense_mlp", "sparse_moe",
]


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """Root-mean-square norm over the last axis of ``x`` [..., d] with ``weight`` [d]."""
    variance = np.mean(np.square(x), axis=-1, keepdims=True)  # [..., 1]
    return (x / np.sqrt(variance + np.float32(eps))) * weight  # [..., d]


def linear(x: np.ndarray, weight: Matrix, bias: np.ndarray | None = None) -> np.ndarray:
    """``x`` [N, in] times ``weight`` [out, in] transposed, plus ``bias`` [out].

    A :class:`Bf16Matrix` is upcast chunk by chunk into a reused scratch
    buffer, each chunk multiplied as it is ready (see :func:`linear_bf16`).
    """
    y = linear_bf16(x, weight) if isinstance(weight, Bf16Matrix) else _product(x, weight)  # [N, out]
    if bias is not None:
        y += bias
    return y


def _product(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """``x`` [N, in] @ ``weight`` [out, in].T in the call shape fastest for N rows."""
    if SMALL_BATCH_ROWS[0] <= x.shape[0] <= SMALL_BATCH_ROWS[1] and x.ndim == 2 and _weight_on_left():
        return np.ascontiguousarray((weight @ x.T).T)  # [N, out]
    return x @ weight.T  # [N, out]


# float32 elements upcast per chunk: 4 MiB, well inside L3, few enough Python calls.
UPCAST_CHUNK = 1 << 20
_scratch = threading.local()  # one buffer per thread: forward may run in several threads


def linear_bf16(x: np.ndarray, weight: Bf16Matrix) -> np.ndarray:
    """``x`` [N, in] @ ``weight``.T [in, out], upcasting at most UPCAST_CHUNK weights at a time.

    Rows are gathered across the matrix's parts into each chunk, so a matrix
    that fits one chunk is one product over exactly the float32 values the
    fp32 mode holds: the same call, bit-identical logits. With upcast workers
    (:func:`set_upcast_workers`), the chunks are shared among the calling
    thread and the workers, each upcasting into its own scratch buffer and
    writing its own columns of the result.
    """
    out_rows, width = weight.shape
    if x.ndim != 2:
        return linear_bf16(x.reshape(-1, width), weight).reshape(*x.shape[:-1], out_rows)  # [..., out]
    out = np.empty((x.shape[0], out_rows), dtype=np.float32)  # [N, out]
    chunks = _chunk_plan(weight, max(1, UPCAST_CHUNK // width))
    pool, helpers = _upcast_pool, _upcast_helpers
    if pool is None or len(chunks) == 1:
        _run_chunks(x, chunks, out)
        return out
    share = len(chunks) // (helpers + 1) or 1  # contiguous shares: each thread streams its own stretch of the file
    futures = [pool.submit(_run_chunks, x, chunks[(k + 1) * share : (k + 2) * share if k + 1 < helpers else None], out)
               for k in range(helpers)]
    _run_chunks(x, chunks[:share], out)
    for future in futures:
        future.result()
    return out


# One chunk: the result columns it fills and the (part, first row, rows) runs that make it.
_Chunk = tuple[int, tuple[tuple[np.ndarray, int, int], ...]]


def _chunk_plan(weight: Bf16Matrix, chunk_rows: int) -> list[_Chunk]:
    chunks, runs, filled, done = [], [], 0, 0
    for part in weight.parts:
        start = 0
        while start < part.shape[0]:
            take = min(part.shape[0] - start, chunk_rows - filled)
            runs.append((part, start, take))
            filled, start = filled + take, start + take
            if filled == chunk_rows:
                chunks.append((done, tuple(runs)))
                runs, done, filled = [], done + filled, 0
    if filled:
        chunks.append((done, tuple(runs)))
    return chunks


def _run_chunks(x: np.ndarray, chunks: list[_Chunk], out: np.ndarray) -> None:
    """Upcast and multiply ``chunks`` in this thread's scratch buffer, into their columns of ``out``."""
    if not chunks:
        return
    width = x.shape[1]
    rows = max(sum(take for _, _, take in runs) for _, runs in chunks)
    buffer = _scratch_buffer(rows * width).reshape(rows, width)  # [rows, in]
    bits = buffer.view(np.uint32)  # [rows, in] the same memory
    for done, runs in chunks:
        filled = 0
        for part, start, take in runs:
            target = bits[filled : filled + take]  # [take, in]
            np.copyto(target, part[start : start + take])  # widen; 2x faster here than a casting left_shift
            target <<= 16
            filled += take
        out[:, done : done + filled] = _product(x, buffer[:filled])


_upcast_pool: concurrent.futures.ThreadPoolExecutor | None = None
_upcast_helpers = 0


def set_upcast_workers(threads: int) -> None:
    """Share each bf16 product's upcast and multiply among ``threads`` threads (1: the caller alone).

    numpy's upcast ufuncs and BLAS both release the GIL, so the threads run on
    separate cores; BLAS itself should then run one thread per call (the
    caller arranges that), or its own threads compete with these.
    """
    global _upcast_pool, _upcast_helpers
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    old, _upcast_pool, _upcast_helpers = _upcast_pool, None, 0
    if old is not None:
        old.shutdown(wait=True)
    if threads > 1:
        _upcast_pool = concurrent.futures.ThreadPoolExecutor(threads - 1, thread_name_prefix="kestrel-upcast")
        _upcast_helpers = threads - 1


def _scratch_buffer(size: int) -> np.ndarray:
    """This thread's float32 scratch of at least ``size`` elements, grown never shrunk."""
    buffer = getattr(_scratch, "buffer", None)
    if buffer is None or buffer.size < size:
        buffer = _scratch.buffer = np.empty(size, dtype=np.float32)  # [size]
    return buffer[:size]


def embedding(table: Matrix, ids: np.ndarray) -> np.ndarray:
    """float32 rows ``ids`` [N] of an embedding ``table`` [vocab, hidden], [N, hidden]."""
    return table.rows(ids) if isinstance(table, Bf16Matrix) else table[ids]


# Batch sizes of a batched decode step. For these, some OpenBLAS kernels run
# W @ x.T (weight as the left operand) 20-30% faster than x @ W.T, others
# slower (docs/performance.md), so the call is chosen by timing both once.
SMALL_BATCH_ROWS = (2, 32)
_small_batch_call: list[str] = []  # "weight_left" or "weight_right" once chosen


def small_batch_call() -> str:
    """The call used for 2-32 rows: "weight_left" (W @ x.T) or "weight_right" (x @ W.T), timed once per process."""
    if not _small_batch_call:
        _small_batch_call.append(_time_small_batch_calls())
    return _small_batch_call[0]


def set_small_batch_call(call: str | None) -> None:
    """Force the 2-32-row call ("weight_left" / "weight_right"), or None to time it again on next use."""
    if call not in (None, "weight_left", "weight_right"):
        raise ValueError(f"unknown small-batch call {call!r}")
    _small_batch_call.clear()
    if call is not None:
        _small_batch_call.append(call)


def _weight_on_left() -> bool:
    return small_batch_call() == "weight_left"


def _time_small_batch_calls(rounds: int = 3) -> str:
    # 72 MiB of weights, more than L3, so the products run on cold weights as in a decode step.
    weights = [np.full((3072, 1024), 0.01, dtype=np.float32) for _ in range(6)]  # 6 x [out, in]
    x = np.full((8, 1024), 0.5, dtype=np.float32)  # [8, in]
    best = {"weight_left": float("inf"), "weight_right": float("inf")}
    for _ in range(rounds):
        for call in best:
            started = time.perf_counter()
            for w in weights:
                _ = (w @ x.T) if call == "weight_left" else (x @ w.T)  # [out, 8] / [8, out]
            best[call] = min(best[call], time.perf_counter() - started)
    return min(best, key=best.__getitem__)


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), elementwise."""
    return x / (np.float32(1.0) + np.exp(-x))


def causal_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, past: int, scale: float) -> np.ndarray:
    """Grouped-query attention of new queries over a sequence's cached keys.

    Args:
        q: [T, n_heads, head_dim], the queries of the T newest tokens.
        keys: [n_kv, past + T, head_dim], every key of the sequence so far.
        values: [n_kv, past + T, head_dim].
        past: tokens before the new ones.
        scale: the score multiplier (head_dim ** -0.5).

    Returns:
        [T, n_heads * head_dim]; query head h reads key/value head h // (n_heads / n_kv).
    """
    t, n_heads, head_dim = q.shape
    n_kv, total, _ = keys.shape
    group = n_heads // n_kv
    grouped = q.reshape(t, n_kv, group, head_dim).transpose(1, 2, 0, 3)  # [n_kv, group, T, head_dim]
    grouped = grouped.reshape(n_kv, group * t, head_dim)  # [n_kv, group*T, head_dim]
    scores = grouped @ keys.transpose(0, 2, 1)  # [n_kv, group*T, total]
    scores *= np.float32(scale)
    if t > 1:
        future = np.arange(total)[None, :] > (past + np.arange(t))[:, None]  # [T, total]
        scores.reshape(n_kv, group, t, total)[:, :, future] = -np.inf
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)  # [n_kv, group*T, total] probabilities
    out = scores @ values  # [n_kv, group*T, head_dim]
    out = out.reshape(n_kv, group, t, head_dim).transpose(2, 0, 1, 3)  # [T, n_kv, group, head_dim]
    return out.reshape(t, n_heads * head_dim)  # [T, n_heads*head_dim]


def dense_mlp(x: np.ndarray, mlp: DenseMLP) -> np.ndarray:
    """SwiGLU: down(silu(gate(x)) * up(x)) for ``x`` [N, hidden]."""
    if mlp.gate_up_proj is None:
        gate = silu(linear(x, mlp.gate_proj))  # [N, inter]
        gate *= linear(x, mlp.up_proj)  # [N, inter]
        return linear(gate, mlp.down_proj)  # [N, hidden]
    inter = mlp.down_proj.shape[1]
    gate_up = linear(x, mlp.gate_up_proj)  # [N, 2*inter]
    return linear(swiglu(gate_up[:, :inter], gate_up[:, inter:]), mlp.down_proj)  # [N, hidden]


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up in one fresh array, rounding as ``silu(gate) * up`` does."""
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
