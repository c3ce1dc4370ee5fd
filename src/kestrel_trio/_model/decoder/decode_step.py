"""One decode step of one sequence (one new token) with integer products, in under twenty calls a layer.

Theory of operation: the general forward pass (kestrel_trio._model.decoder.forward)
serves any batch; for one token its bookkeeping outweighs its arithmetic. A
SmolLM2-135M step made about 16,600 Python-level calls (550 a layer: shape
properties, per-call kernel choice, wrappers' checks, numpy temporaries);
here about 500 (docs/performance.md has the counts): everything that does
not change between steps is settled once per model, product mode and thread:

- each integer matrix part's compiled kernel, bound to its rows
  (kestrel_trio._kernels.integer_rows), and bound again to this thread's
  activation and output buffers: a product is a call without arguments;
- the buffers themselves: the residual row, the normed row and its int8
  quantization, q/k/v, attention output, gate/up, activation;
- a layer is then (SmolLM2: 18 calls): the layer before's residual add, the
  RMS norm (kestrel_trio._kernels.portable.norm's loop with the general path's
  arguments), its quantization, the q/k/v parts (Qwen3: the head norms),
  rotation and the cache write (kestrel_trio._kernels.portable.chunk_qkv, one call),
  attention (one call), its quantization, o_proj, add, norm, quantization,
  the gate/up parts, SwiGLU, its quantization, down_proj.

Every value is computed as the general path computes it, by the same
loops or loops of the same arithmetic (tests/model/test_decode_step.py
compares the logits bit for bit). A matrix without an integer kernel in this
mode (lm_head in F16, say) takes :func:`~kestrel_trio._model.products.matmul.linear`.
A model takes this path only where it can: dense MLPs, a float32 KV cache,
compiled loops, and at least one integer product; else :func:`decode_step`
says no and the general path runs.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Callable

import numpy as np

from kestrel_trio import _kernels
from kestrel_trio._model.products import matmul
from kestrel_trio._model.products.backend import current
from kestrel_trio._model.products.jobs import job_rows
from kestrel_trio._model.decoder.decode_share import SharedOrAlone, in_turn, choosers
from kestrel_trio._model.cache.kv_cache import KVCache
from kestrel_trio._model.decoder import layers
from kestrel_trio._model.decoder.layers import embedding
from kestrel_trio._model.products.matmul import linear
from kestrel_trio._model.forms.packed import GgmlRows, PackedMatrix
from kestrel_trio._model.weights.assemble import DenseMLP

__all__ = ["decode_step"]

_RUN = 32  # the activations' quantization block (the integer products' unit), a run-time argument of the loops


def decode_step(decoder, token: int, position: int, cache: KVCache) -> np.ndarray | None:
    """The logits float32 [1, vocab] of one new ``token`` at ``position`` of ``cache``'s sequence, the cache
    extended by it; None (nothing done) where this path does not apply (see the module's docstring)."""
    if not cache.stores_float32:  # (a new cache has no buffers yet: the step reserves them)
        return None
    plan = _plan_of(decoder)
    if plan is None:
        return None
    return plan.step(token, position, cache)


_plans: dict[tuple[int, str], "_Plan | None"] = {}  # (id of the decoder, product mode) -> its plan
_plans_lock = threading.Lock()


def _plan_of(decoder) -> "_Plan | None":
    key = (id(decoder), current().products)
    try:
        return _plans[key]
    except KeyError:
        pass
    with _plans_lock:
        if key not in _plans:
            _plans[key] = _Plan.build(decoder)
            weakref.finalize(decoder, _plans.pop, key, None)  # the id may be reused once the decoder is gone
        return _plans[key]


class _Matrix:
    """One matrix's product from fixed input buffers: its integer parts' bound kernels, or linear() as a whole."""

    def __init__(self, matrix, bias: np.ndarray | None) -> None:
        self.matrix, self.bias = matrix, bias
        self.rows, self.cols = matrix.shape
        self.parts: list[tuple[Callable, int, int]] | None = None  # (kernel, first column, columns)
        self.minimums = False
        if isinstance(matrix, PackedMatrix) and self.cols % _RUN == 0:
            parts, first = [], 0
            for part in matrix.parts:
                is_ggml = isinstance(part, GgmlRows)
                bound = _kernels.integer_rows(part.form, part.data, current().products) if is_ggml else None
                if bound is None:
                    break
                parts.append((bound[0], first, part.rows))
                self.minimums |= bound[1]
                first += part.rows
            else:
                self.parts = parts

    def calls(self, x: np.ndarray, quantized: tuple, out: np.ndarray, threads, chooser) -> list[Callable[[], None]]:
        """Calls without arguments that write ``out`` [1, rows] = ``x`` [1, cols] @ matrix.T (+ bias), for
        ``quantized`` = (xq, xd, xs), the quantization of ``x`` that the calls before these leave in place; shared
        among ``threads`` or not as ``chooser`` (kestrel_trio._model.decoder.decode_share) says, where they are several
        (None: always shared)."""
        if self.parts is None:
            return [functools.partial(_linear_into, x, self.matrix, self.bias, out)]
        xq, xd, xs = quantized

        def tasks_for(spans: list[tuple[int, int]]) -> list[list[Callable[[], None]]]:
            """One task a thread: its stretch of the matrix's rows, across the parts."""
            return [[functools.partial(kernel, xq, xd, xs, max(start, lo) - lo, min(stop, lo + n) - lo,
                                       out[:, max(start, lo) : min(stop, lo + n)])
                     for kernel, lo, n in self.parts if max(start, lo) < min(stop, lo + n)] for start, stop in spans]

        if threads is None or self.rows * self.cols < matmul.SHARE_MIN_ELEMENTS or self.rows <= matmul.SHARE_ALIGN:
            calls = tasks_for([(0, self.rows)])[0]
        elif chooser is None:  # always shared (integer products: no BLAS in them)
            tasks = [in_turn(task) for task in tasks_for(matmul._share_bounds(self.rows, threads.count))]
            calls = [functools.partial(threads.run, tasks, blas=False)]
        else:
            calls = [SharedOrAlone(threads, self.rows, tasks_for, self.rows * self.cols, chooser)]
        if self.bias is not None:
            calls.append(functools.partial(np.add, out, self.bias, out=out))
        return calls


def _linear_into(x: np.ndarray, matrix, bias: np.ndarray | None, out: np.ndarray) -> None:
    out[...] = linear(x, matrix, bias)  # [1, rows]


class _Layer:
    """One decoder layer's weights as the step reads them."""

    def __init__(self, layer) -> None:
        a, mlp = layer.attn, layer.mlp
        self.input_norm, self.post_norm = layer.input_layernorm, layer.post_attention_layernorm
        if a.qkv_proj is not None:
            self.qkv = [_Matrix(a.qkv_proj, a.qkv_bias)]
        else:
            self.qkv = [_Matrix(a.q_proj, a.q_bias), _Matrix(a.k_proj, a.k_bias), _Matrix(a.v_proj, a.v_bias)]
        self.o = _Matrix(a.o_proj, a.o_bias)
        if mlp.gate_up_proj is not None:
            self.gate_up = [_Matrix(mlp.gate_up_proj, mlp.gate_up_bias)]
        else:
            self.gate_up = [_Matrix(mlp.gate_proj, mlp.gate_bias), _Matrix(mlp.up_proj, mlp.up_bias)]
        self.down = _Matrix(mlp.down_proj, mlp.down_bias)
        self.q_norm, self.k_norm = a.q_norm, a.k_norm

    def matrices(self) -> list[_Matrix]:
        return [*self.qkv, self.o, *self.gate_up, self.down]


class _Plan:
    """What a model's decode step settles once: its layers' matrices and kernels; the buffers, per thread."""

    def __init__(self, decoder, layers: list[_Layer], head: _Matrix, loops) -> None:
        c = decoder.config
        self.config, self.layers, self.head = c, layers, head
        # Not the decoder itself: the plans' table would keep it alive, and its finalizer would never drop the plan.
        self.embed, self.rope, self.final_norm = decoder.weights.embed_tokens, decoder.rope, decoder.weights.norm
        self.integer, self.chunk_qkv, self.exp, self.norm = loops
        self.minimums = any(m.minimums for layer in layers for m in layer.matrices()) or head.minimums
        self.eps = np.float32(c.rms_norm_eps)
        self.scale = np.float32(c.head_dim**-0.5)
        self.qkv_width = (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim
        self.inter = layers[0].down.cols
        self._local = threading.local()
        # Per model, not per stepping thread (the engine's steps alternate between two): whether each kind of
        # layer product is shared, from its recent costs both ways.
        self.choosers = choosers()

    @classmethod
    def build(cls, decoder) -> "_Plan | None":
        c, w = decoder.config, decoder.weights
        loops = _kernels.decode_loops()
        if loops is None or not all(isinstance(layer.mlp, DenseMLP) for layer in w.layers) or c.head_dim % 2:
            return None
        if any(n is not None and n.dtype != np.float32 for layer in w.layers for n in (
                layer.input_layernorm, layer.post_attention_layernorm, layer.attn.q_norm, layer.attn.k_norm)):
            return None
        layers = [_Layer(layer) for layer in w.layers]
        head = _Matrix(w.lm_head, None)
        widths = {c.hidden_size, c.num_attention_heads * c.head_dim, layers[0].down.cols}
        if len({layer.down.cols for layer in layers}) != 1 or any(width % _RUN for width in widths):
            return None
        if not any(m.parts is not None for layer in layers for m in layer.matrices()):
            return None  # nothing takes an integer product here: the general path is as short
        return cls(decoder, layers, head, loops)

    def step(self, token: int, position: int, cache: KVCache) -> np.ndarray:
        c, b = self.config, self._buffers()
        cache.reserve(1)
        b.x[...] = embedding(self.embed, np.array([token]))  # [1, hidden]
        cos, sin = self.rope.cos_sin(np.array([position]))  # [1, head_dim/2] each
        past = cache.length
        total = past + 1
        n_heads, n_kv = c.num_attention_heads, c.num_key_value_heads
        shared = b.threads is not None and total * n_heads >= layers.SHARED_DECODE_SCORES
        qkv_rows, attention, q = self.chunk_qkv.qkv_rows, self.exp.decode_attention, b.q
        for index, calls in enumerate(b.layers):
            for call in calls[0]:  # the last layer's residual add, norm, quantization, q/k/v (Qwen3: head norms)
                call()
            keys, values = cache.keys[index], cache.values[index]  # [n_kv, capacity, head_dim] each
            # rotation (the heads normed before, where the model norms them) and the cache write, in one call
            qkv_rows(b.rotated, n_heads, n_kv, cos[0], cos[0], False, self.eps, cos, sin, q, keys, values, past, 0, 1)
            if shared:
                b.attended[...] = _kernels.decode_attention(q[0], keys[:, :total], values[:, :total], self.scale,
                                                            matmul.run_shared, matmul.shares_of).reshape(n_heads, -1)
            else:
                attention(b.q0, keys, values, total, 0, n_kv, self.scale, b.attended)
            for call in calls[1]:  # quantization, o_proj, add, norm, quantization, gate/up, SwiGLU, quantization, down
                call()
        for call in b.final:  # the last residual add, the final norm and its quantization
            call()
        cache.commit(1)
        logits = np.empty((1, self.head.rows), dtype=np.float32)  # [1, vocab]
        if b.head_jobs is not None:  # the head's job rows, pointed at this step's logits
            rows, table = b.head_jobs
            rows.aim(table, logits)
            b.threads.run_jobs(table)
            return logits
        for call in self.head.calls(b.h, b.hidden_q, logits, b.threads, None):  # (decode_share: why always shared)
            call()
        return logits

    def _buffers(self) -> "_Buffers":
        b = getattr(self._local, "buffers", None)
        threads = current().threads
        if b is None or b.threads is not threads:
            b = self._local.buffers = _Buffers(self, threads)
        return b


class _Buffers:
    """One thread's activation buffers for a plan, and its layers' calls bound to them."""

    def __init__(self, plan: _Plan, threads) -> None:
        c = plan.config
        hidden, heads = c.hidden_size, c.num_attention_heads * c.head_dim
        self.threads = threads
        self.x = np.zeros((1, hidden), dtype=np.float32)  # [1, hidden], the residual stream
        self.h = np.empty((1, hidden), dtype=np.float32)  # [1, hidden], normed
        self.hidden_q = _quantized(hidden)
        self.qkv = np.empty((1, plan.qkv_width), dtype=np.float32)  # [1, (n_heads + 2 n_kv) * head_dim]
        self.q = np.empty((1, c.num_attention_heads, c.head_dim), dtype=np.float32)  # [1, n_heads, head_dim]
        self.q0 = self.q[0]  # [n_heads, head_dim]
        self.attended = np.empty((c.num_attention_heads, c.head_dim), dtype=np.float32)  # [n_heads, head_dim]
        attended = self.attended.reshape(1, heads)  # [1, n_heads*head_dim], a view
        attended_q = _quantized(heads)
        self.o = np.empty((1, hidden), dtype=np.float32)  # [1, hidden]
        self.gate_up = np.empty((1, 2 * plan.inter), dtype=np.float32)  # [1, 2*inter]
        self.act = np.empty((1, plan.inter), dtype=np.float32)  # [1, inter]
        act_q = _quantized(plan.inter)
        self.down = np.empty((1, hidden), dtype=np.float32)  # [1, hidden]
        d, sums = plan.integer, plan.minimums
        x_span = _kernels.norm_span(self.x)  # the general path's arguments to the norm's loop, for these buffers
        h3 = self.h.reshape(1, 1, hidden)  # [1, 1, hidden], a view

        def norm(weight: np.ndarray, delta: np.ndarray | None) -> list[Callable[[], None]]:
            """The residual add (``delta`` into x, in place), the RMS norm into h, its quantization."""
            calls = [] if delta is None else [functools.partial(np.add, self.x, delta, out=self.x)]
            calls.append(functools.partial(plan.norm.rms_norm, *x_span, weight, plan.eps, h3))
            calls.append(functools.partial(d.quantize_rows, self.h, _RUN, *self.hidden_q, sums))
            return calls

        q_end, k_end = heads, heads + c.num_key_value_heads * c.head_dim
        self.rotated = self.qkv  # what the rotation and the cache write read: q/k/v, or its heads normed
        if any(layer.q_norm is not None for layer in plan.layers):  # Qwen3: the heads normed as the general path does
            self.rotated = np.empty_like(self.qkv)  # [1, (n_heads + 2 n_kv) * head_dim]
        shape = {0: (c.num_attention_heads, 0, q_end), 1: (c.num_key_value_heads, q_end, k_end)}

        def head_norms(layer: _Layer) -> list[Callable[[], None]]:
            if layer.q_norm is None:
                return []
            calls = []
            for which, weight in ((0, layer.q_norm), (1, layer.k_norm)):
                n, lo, hi = shape[which]
                heads_in = self.qkv[:, lo:hi].reshape(1, n, c.head_dim)  # [1, n, head_dim], a strided view
                heads_out = self.rotated[:, lo:hi].reshape(1, n, c.head_dim)  # [1, n, head_dim]
                calls.append(functools.partial(plan.norm.rms_norm, *_kernels.norm_span(heads_in), weight, plan.eps,
                                               heads_out))
            calls.append(functools.partial(np.copyto, self.rotated[:, k_end:], self.qkv[:, k_end:]))  # the values
            return calls

        self.tables: list[np.ndarray] = []  # the job tables the calls run (they hold these buffers' addresses)

        def products(matrices: list[_Matrix], x: np.ndarray, quantized: tuple, out: np.ndarray,
                     kind: str | None) -> list[Callable[[], None]]:
            """The calls writing ``out`` [1, sum of rows] = ``x`` @ each of ``matrices``.T in turn: one shared
            job table where the product threads take compiled jobs (kestrel_trio._model.products.jobs), else each
            matrix's calls."""
            outs, first = [], 0
            for m in matrices:
                outs.append((m, out[:, first : first + m.rows]))
                first += m.rows
            rows = _job_rows(matrices, threads) if first * x.shape[1] >= matmul.SHARE_MIN_ELEMENTS else None
            if rows is not None:
                self.tables.append(rows.table_for(quantized, out))
                return [functools.partial(threads.run_jobs, self.tables[-1])]
            chooser = None if kind is None else plan.choosers[kind]
            return [call for m, view in outs for call in m.calls(x, quantized, view, threads, chooser)]

        self.layers = []
        for index, layer in enumerate(plan.layers):
            before = norm(layer.input_norm, None if index == 0 else self.down)
            before += products(layer.qkv, self.h, self.hidden_q, self.qkv, "qkv")
            before += head_norms(layer)
            after = [functools.partial(d.quantize_rows, attended, _RUN, *attended_q, sums)]
            after += products([layer.o], attended, attended_q, self.o, "o")
            after += norm(layer.post_norm, self.o)
            after += products(layer.gate_up, self.h, self.hidden_q, self.gate_up, "gate_up")
            after.append(functools.partial(plan.exp.swiglu, self.gate_up, self.act))
            after.append(functools.partial(d.quantize_rows, self.act, _RUN, *act_q, sums))
            after += products([layer.down], self.act, act_q, self.down, "down")
            self.layers.append((before, after))
        self.final = norm(plan.final_norm, self.down)
        # The head's job rows and a table of them, re-aimed at each step's logits (a new array each step).
        self.head_jobs = None
        rows = _job_rows([plan.head], threads)
        if rows is not None:
            self.head_jobs = (rows, rows.table_for(self.hidden_q, np.empty((1, plan.head.rows), dtype=np.float32)))


def _job_rows(matrices: list[_Matrix], threads):
    """The job rows of ``matrices``' products stacked (kestrel_trio._model.products.jobs), where the product
    threads take compiled jobs and every part has its CPU's own integer kernel; else None."""
    if threads is None or not threads.takes_jobs or any(m.parts is None or m.bias is not None for m in matrices):
        return None
    return job_rows([part for m in matrices for part in m.matrix.parts], current().products, threads.count)


def _quantized(cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Buffers for one row of ``cols`` quantized: int8 [1, cols], scales and block sums float32 [1, cols/32]."""
    return (np.empty((1, cols), dtype=np.int8), np.empty((1, cols // _RUN), dtype=np.float32),
            np.zeros((1, cols // _RUN), dtype=np.float32))
