"""The decode-speed layouts (fused projections, direct reads, small-batch calls) change no result."""

from __future__ import annotations

import threading
from pathlib import Path

import attrs
import numpy as np
import pytest

from kestrel_trio import load_model
from kestrel_trio.model import set_blas_threads
from kestrel_trio._model import forward
from kestrel_trio._model.decoder import layers
from kestrel_trio._model.products import matmul
from kestrel_trio._model.products.backend import current
from kestrel_trio._model.products.product_threads import ProductThreads
from kestrel_trio._model.products.matmul import SMALL_BATCH_CALLS, linear, set_small_batch_call, small_batch_call
from kestrel_trio._model.checkpoints.random_init import write_random_checkpoint
from kestrel_trio._model.checkpoints.safetensors import SafetensorsCheckpoint
from kestrel_trio._model.weights.assemble import Attention, DenseMLP, SparseMoE
from kestrel_trio.errors import ModelLoadError
from slow_host import allowance

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TINY = {
    "architectures": ["Qwen2ForCausalLM"], "vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 24,
    "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "rope_theta": 10000.0,
}


def _unfused(decoder):
    """The same decoder with every fused matrix replaced by separate copies (the pre-fusion layout)."""

    def attn(a: Attention) -> Attention:
        copy = lambda m: None if m is None else m.copy()  # noqa: E731
        return attrs.evolve(a, q_proj=a.q_proj.copy(), k_proj=a.k_proj.copy(), v_proj=a.v_proj.copy(),
                            q_bias=copy(a.q_bias), k_bias=copy(a.k_bias), v_bias=copy(a.v_bias),
                            qkv_proj=None, qkv_bias=None)

    def mlp(m):
        if isinstance(m, SparseMoE):
            return attrs.evolve(m, experts=tuple(mlp(e) for e in m.experts))
        return DenseMLP(gate_proj=m.gate_proj.copy(), up_proj=m.up_proj.copy(), down_proj=m.down_proj)

    layers = tuple(attrs.evolve(layer, attn=attn(layer.attn), mlp=mlp(layer.mlp)) for layer in decoder.weights.layers)
    return attrs.evolve(decoder, weights=attrs.evolve(decoder.weights, layers=layers))


@pytest.mark.parametrize("name", ["qwen2_fp32", "qwen3_bf16_tied", "qwen3_moe"])
def test_fused_projections_equal_separate_ones(name):
    model = load_model(FIXTURES / name)
    ids = np.arange(3, 14, dtype=np.int64)  # [T]
    positions = np.arange(ids.size, dtype=np.int64)  # [T]
    fused = forward(model.decoder, ids, positions, [model.new_cache()], [ids.size], all_logits=True)
    separate = forward(_unfused(model.decoder), ids, positions, [model.new_cache()], [ids.size], all_logits=True)
    assert fused.shape == (ids.size, model.config.vocab_size)
    np.testing.assert_allclose(fused, separate, rtol=0, atol=1e-5 * max(1.0, float(np.abs(separate).max())))


def test_separate_names_are_views_of_the_fused_matrix_with_the_checkpoint_values(tmp_path):
    tensors = write_random_checkpoint(tmp_path, TINY, seed=3)
    attn = load_model(tmp_path).decoder.weights.layers[1].attn
    mlp = load_model(tmp_path).decoder.weights.layers[1].mlp
    p = "model.layers.1."
    for part in ("q", "k", "v"):
        assert np.shares_memory(getattr(attn, f"{part}_proj"), attn.qkv_proj)
        np.testing.assert_array_equal(getattr(attn, f"{part}_proj"), tensors[p + f"self_attn.{part}_proj.weight"])
        np.testing.assert_array_equal(getattr(attn, f"{part}_bias"), tensors[p + f"self_attn.{part}_proj.bias"])
    assert attn.qkv_proj.shape == (4 * 8 + 2 * 2 * 8, 16) and not attn.qkv_proj.flags.writeable
    assert np.shares_memory(mlp.up_proj, mlp.gate_up_proj)
    np.testing.assert_array_equal(mlp.up_proj, tensors[p + "mlp.up_proj.weight"])
    np.testing.assert_array_equal(mlp.gate_proj, tensors[p + "mlp.gate_proj.weight"])


@pytest.mark.parametrize("dtype", ["F32", "BF16", "F16"])
def test_read_into_equals_read(tmp_path, dtype):
    write_random_checkpoint(tmp_path, TINY, seed=4, dtype=dtype)
    checkpoint = SafetensorsCheckpoint(tmp_path)
    name = "model.layers.0.mlp.down_proj.weight"
    out = np.full((16, 24), np.nan, dtype=np.float32)
    checkpoint.read_into(name, out)
    np.testing.assert_array_equal(out, checkpoint.read(name))
    with pytest.raises(ValueError, match="destination"):
        checkpoint.read_into(name, np.empty((16, 23), dtype=np.float32))


@pytest.mark.parametrize("rows", [1, 2, 8, 17, 32, 40])
@pytest.mark.parametrize("out_rows", [48, 300])  # 300: whole blocks of every size and a remainder
def test_every_small_batch_call_computes_the_same_product(rows, out_rows):
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 64), dtype=np.float32)  # [rows, in]
    w = rng.standard_normal((out_rows, 64), dtype=np.float32)  # [out, in]
    bias = rng.standard_normal(out_rows, dtype=np.float32)  # [out]
    expected = x.astype(np.float64) @ w.T.astype(np.float64) + bias  # [rows, out]
    try:
        for call in SMALL_BATCH_CALLS:
            set_small_batch_call(call)
            y = linear(x, w, bias)
            assert y.shape == (rows, out_rows) and y.flags.c_contiguous
            np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-4)
    finally:
        set_small_batch_call(None)


def test_the_small_batch_call_is_timed_once_and_can_be_forced():
    set_small_batch_call(None)
    assert small_batch_call() in SMALL_BATCH_CALLS
    set_small_batch_call("weight_right")
    assert small_batch_call() == "weight_right"
    with pytest.raises(ValueError):
        set_small_batch_call("sideways")
    set_small_batch_call(None)


@pytest.mark.parametrize("rows", [1, 5, 8, 40])
def test_products_shared_among_threads_equal_the_single_thread_ones(monkeypatch, rows):
    monkeypatch.setattr(matmul, "SHARE_MIN_ELEMENTS", 0)
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 32), dtype=np.float32)  # [rows, in]
    w = rng.standard_normal((1000, 32), dtype=np.float32)  # [out, in]: shares of 384, 384 and 232 rows
    before = matmul.product_threads() or 1
    try:
        for call in SMALL_BATCH_CALLS:
            set_small_batch_call(call)
            matmul.set_product_threads(1)
            alone = linear(x, w)  # [rows, out]
            matmul.set_product_threads(3)
            shared = linear(x, w)  # [rows, out]
            # BLAS may sum in another order for another width: equal to float32 rounding, not bit for bit
            np.testing.assert_allclose(shared, alone, rtol=1e-6, atol=1e-5)
            np.testing.assert_allclose(shared, x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-5, atol=1e-4)
    finally:
        matmul.set_product_threads(before)
        set_small_batch_call(None)


def test_an_error_in_a_product_thread_reaches_the_caller_and_the_threads_go_on():
    threads = ProductThreads(3)
    ran = []
    try:
        with pytest.raises(ZeroDivisionError):
            threads.run([lambda: ran.append(0), lambda: 1 / 0, lambda: ran.append(2)])
        assert sorted(ran) == [0, 2]
        threads.run([lambda: ran.append(3), lambda: ran.append(4), lambda: ran.append(5)])
        assert sorted(ran) == [0, 2, 3, 4, 5]
    finally:
        threads.stop()


def _blas_thread_counts() -> set[int]:
    """The thread count of each BLAS library numpy's process has loaded (threadpoolctl's view)."""
    import threadpoolctl

    return {i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"}


def test_blas_threads_is_applied_process_wide_and_validated(tmp_path):
    pytest.importorskip("threadpoolctl")
    write_random_checkpoint(tmp_path, TINY, seed=5)
    before = matmul.product_threads() or max(_blas_thread_counts())
    try:
        load_model(tmp_path, blas_threads=3)
        assert _blas_thread_counts() == {3}
        assert matmul.product_threads() == 3
        seen = []  # while the 3 product threads share a product, each calls one-thread BLAS
        current().threads.run([lambda: seen.append(_blas_thread_counts())] * 3)
        assert seen == [{1}] * 3 and _blas_thread_counts() == {3}
        with pytest.raises(ModelLoadError, match="blas_threads"):
            load_model(tmp_path, blas_threads=0)
        assert matmul.product_threads() == 3
    finally:
        set_blas_threads(before)


def test_blas_default_count_is_read_once_before_kestrel_changes_it():
    """BLAS's own count is read once, before kestrel first sets it: a load without blas_threads goes back to it."""
    from kestrel_trio.model.settings import _blas_at_start

    first = _blas_at_start()
    try:
        set_blas_threads(3)
        assert _blas_at_start() == first
    finally:
        set_blas_threads(first[1])


def test_product_threads_run_one_thread_blas_when_the_caller_is_a_worker_thread(tmp_path):
    """The engine steps in a worker thread, where OpenBLAS ignores the process-wide count: each thread is switched."""
    pytest.importorskip("threadpoolctl")
    write_random_checkpoint(tmp_path, TINY, seed=5)
    before = matmul.product_threads() or max(_blas_thread_counts())
    seen, after = [], []

    def step_in_a_worker() -> None:
        current().threads.run([lambda: seen.append(_blas_thread_counts())] * 2)
        after.append(_blas_thread_counts())

    try:
        load_model(tmp_path, blas_threads=2)
        worker = threading.Thread(target=step_in_a_worker)
        worker.start()
        worker.join(timeout=allowance(30))
        assert seen == [{1}] * 2, f"BLAS threads seen inside a shared product: {seen}"
        assert after == [{2}], "the worker's own BLAS count is given back after the product"
    finally:
        set_blas_threads(before)


def _reference_attention(q, keys, values, past, scale):
    """Causal grouped-query attention in float64, one head and one query at a time."""
    t, n_heads, head_dim = q.shape
    group = n_heads // keys.shape[0]
    out = np.empty((t, n_heads, head_dim))
    for i in range(t):
        for h in range(n_heads):
            k, v = keys[h // group, : past + i + 1].astype(np.float64), values[h // group, : past + i + 1]
            scores = k @ q[i, h].astype(np.float64) * scale
            weights = np.exp(scores - scores.max())
            out[i, h] = weights @ v / weights.sum()
    return out.reshape(t, n_heads * head_dim)


@pytest.mark.parametrize(("t", "past"), [(1, 0), (1, 9), (6, 0), (6, 5), (64, 0), (150, 20)])  # 150: three query blocks
def test_attention_shared_among_threads_equals_the_reference(monkeypatch, t, past):
    rng = np.random.default_rng(t + past)
    q = rng.standard_normal((t, 6, 8), dtype=np.float32)  # [T, n_heads, head_dim]
    keys = rng.standard_normal((3, past + t, 8), dtype=np.float32)  # [n_kv, total, head_dim]: 3 kv heads, 2 threads
    values = rng.standard_normal((3, past + t, 8), dtype=np.float32)  # [n_kv, total, head_dim]
    expected = _reference_attention(q, keys, values, past, 8**-0.5)  # [T, n_heads*head_dim]
    before = matmul.product_threads() or 1
    try:
        matmul.set_product_threads(2)
        alone = layers.causal_attention(q, keys, values, past, 8**-0.5)
        monkeypatch.setattr(layers, "SHARED_ATTENTION_SCORES", 0)
        shared = layers.causal_attention(q, keys, values, past, 8**-0.5)
    finally:
        matmul.set_product_threads(before)
    np.testing.assert_array_equal(shared, alone)  # each kv head is computed by the same calls either way
    np.testing.assert_allclose(shared, expected, rtol=1e-5, atol=1e-5)


def _recording_run_shared(monkeypatch) -> list[int]:
    """Replace layers' run_shared by one that records each call's task count and refuses to nest
    (a task of the product threads asking them for more work would wait for itself)."""
    calls, depth = [], [0]
    real = layers.run_shared

    def recording(tasks):
        assert depth[0] == 0, "run_shared called from a task already on the product threads"
        calls.append(len(tasks))
        depth[0] += 1
        try:
            real(tasks)
        finally:
            depth[0] -= 1

    monkeypatch.setattr(layers, "run_shared", recording)
    return calls


@pytest.mark.parametrize("threads", [2, 3])
def test_one_query_s_attention_shared_among_threads_equals_the_one_thread_call(monkeypatch, threads):
    from kestrel_trio import _kernels

    if not _kernels.ready():
        pytest.skip(f"the compiled decode attention cannot run here: {_kernels.unavailable_reason()}")
    rng = np.random.default_rng(threads)
    q = rng.standard_normal((1, 6, 8), dtype=np.float32)  # [1, n_heads, head_dim]
    keys = rng.standard_normal((3, 40, 8), dtype=np.float32)  # [n_kv, total, head_dim]
    values = rng.standard_normal((3, 40, 8), dtype=np.float32)  # [n_kv, total, head_dim]
    before = matmul.product_threads() or 1
    try:
        matmul.set_product_threads(threads)
        calls = _recording_run_shared(monkeypatch)
        alone = layers.causal_attention(q, keys, values, 39, 8**-0.5)
        assert calls == []  # 6 x 40 scores: below the threshold
        monkeypatch.setattr(layers, "SHARED_DECODE_SCORES", 0)
        shared = layers.causal_attention(q, keys, values, 39, 8**-0.5)
    finally:
        matmul.set_product_threads(before)
    assert calls == [min(threads, 3)]
    np.testing.assert_array_equal(shared, alone)  # each head is computed by the same loop either way
    np.testing.assert_allclose(shared, _reference_attention(q, keys, values, 39, 8**-0.5), rtol=1e-5, atol=1e-5)


def test_a_batched_decode_step_s_one_call_a_sequence_equals_the_per_sequence_path(tmp_path, monkeypatch):
    from kestrel_trio import _kernels

    if not _kernels.ready():
        pytest.skip(f"the compiled decode attention cannot run here: {_kernels.unavailable_reason()}")
    write_random_checkpoint(tmp_path, TINY, seed=12)
    model = load_model(tmp_path)
    prompts = [[3, 4, 5, 6, 7, 8, 9], [10], [11, 12, 13]]

    def batched_step(kv_dtype: str = "fp32") -> np.ndarray:
        caches = [model.new_cache(kv_dtype) for _ in prompts]
        for cache, ids in zip(caches, prompts):
            model.prefill(cache, ids)
        positions = np.array([cache.length for cache in caches])  # [B]
        return forward(model.decoder, np.array([20, 21, 22]), positions, caches, [1] * len(prompts))  # [B, vocab]

    taken = []
    real = _kernels.decode_buffers
    monkeypatch.setattr(_kernels, "decode_buffers", lambda *args: taken.append(real(*args) is not None) or real(*args))
    lean = batched_step()
    assert taken == [True] * TINY["num_hidden_layers"]  # every layer's step took the one-call path
    bf16 = batched_step("bf16")  # bf16 caches: widened as read, the per-sequence path
    assert taken[TINY["num_hidden_layers"]:] == [False] * TINY["num_hidden_layers"]
    monkeypatch.setattr(_kernels, "decode_buffers", lambda *args: None)
    per_sequence = batched_step()
    np.testing.assert_array_equal(lean, per_sequence)  # the same compiled loop per sequence either way
    np.testing.assert_allclose(bf16, lean, rtol=0.05, atol=0.05)


def test_a_batched_decode_step_shares_its_sequences_attention_and_changes_no_logit(tmp_path, monkeypatch):
    from kestrel_trio import _kernels

    write_random_checkpoint(tmp_path, TINY, seed=11)
    prompts = [[3, 4, 5, 6, 7, 8, 9], [10], [11, 12, 13], [14, 15, 16, 17, 18]]
    before = matmul.product_threads() or 1

    def batched_step() -> np.ndarray:
        caches = [model.new_cache() for _ in prompts]
        for cache, ids in zip(caches, prompts):
            model.prefill(cache, ids)
        positions = np.array([cache.length for cache in caches])  # [B]
        calls.clear()  # the decode step's calls only (a one-token prompt's prefill is a one-query attention)
        return forward(model.decoder, np.array([20, 21, 22, 23]), positions, caches, [1] * len(prompts))

    try:
        matmul.set_product_threads(2)
        model = load_model(tmp_path)  # its product threads: the 2 just set
        calls = _recording_run_shared(monkeypatch)
        alone = batched_step()  # [B, vocab]
        assert calls == []  # a few keys: below the threshold
        monkeypatch.setattr(layers, "SHARED_DECODE_SCORES", 0)
        shared = batched_step()
    finally:
        matmul.set_product_threads(before)
    assert calls == [2] * TINY["num_hidden_layers"]  # one shared call a layer, two runs of sequences
    np.testing.assert_array_equal(shared, alone)


def test_a_batched_step_s_sequences_are_split_by_their_keys():
    assert layers._shares_by_keys([10, 10, 10, 10], 2) == [(0, 2), (2, 4)]
    assert layers._shares_by_keys([100, 1, 1, 1], 2) == [(0, 1), (1, 4)]
    assert layers._shares_by_keys([1, 1, 1, 100], 2) == [(0, 3), (3, 4)]
    assert layers._shares_by_keys([5, 5, 5], 3) == [(0, 1), (1, 2), (2, 3)]
    assert layers._shares_by_keys([7], 2) == [(0, 1)]
    assert layers._shares_by_keys([7, 7, 7], 1) == [(0, 3)]


@pytest.mark.parametrize("t", [6, 64, 128])  # a verify step, a short chunk, a 128-token prompt's one chunk
def test_attention_below_the_sharing_threshold_runs_on_one_blas_thread(tmp_path, monkeypatch, t):
    """Never on BLAS's own threads: woken, they spin on after it and slow the shared product that follows
    (measured on a 2-core Zen 4: a 128-token prefill with shared products took 2x longer, OpenBLAS's
    worker burning 1.7 s of CPU beside them)."""
    pytest.importorskip("threadpoolctl")
    write_random_checkpoint(tmp_path, TINY, seed=5)
    before = matmul.product_threads() or max(_blas_thread_counts())
    seen = []
    real = layers._attend_blocks

    def recording(*args):
        seen.append(_blas_thread_counts())
        real(*args)

    rng = np.random.default_rng(t)
    q = rng.standard_normal((t, 4, 8), dtype=np.float32)  # [T, n_heads, head_dim]
    keys = rng.standard_normal((2, t, 8), dtype=np.float32)  # [n_kv, T, head_dim]
    try:
        load_model(tmp_path, blas_threads=2)
        assert t * t * 4 < layers.SHARED_ATTENTION_SCORES
        monkeypatch.setattr(layers, "_attend_blocks", recording)
        layers.causal_attention(q, keys, keys, 0, 8**-0.5)
    finally:
        set_blas_threads(before)
    assert seen == [{1}], f"BLAS thread counts seen by the attention: {seen}"


def test_shares_split_items_among_the_product_threads():
    before = matmul.product_threads() or 1
    try:
        matmul.set_product_threads(3)
        assert matmul.shares_of(8) == [(0, 2), (2, 5), (5, 8)]
        assert matmul.shares_of(2) == [(0, 1), (1, 2)]
        matmul.set_product_threads(1)
        assert matmul.shares_of(8) == [(0, 8)]
    finally:
        matmul.set_product_threads(before)


def test_the_small_batch_call_is_chosen_on_a_sample_unless_forced():
    sample = [np.full((256, 64), 0.5, dtype=np.float32), np.full((64, 128), 0.5, dtype=np.float32)]  # [out, in]
    try:
        set_small_batch_call("weight_left")
        assert matmul.choose_small_batch_call(sample) == "weight_left"  # a forced call stays
        set_small_batch_call(None)
        assert matmul.choose_small_batch_call(sample) in SMALL_BATCH_CALLS
    finally:
        set_small_batch_call(None)


def test_a_sample_replaces_a_choice_timed_on_stand_in_weights_or_a_smaller_sample():
    sample = [np.full((256, 64), 0.5, dtype=np.float32)]  # [out, in]
    try:
        set_small_batch_call(None)
        small_batch_call()  # a first small product before any model sample: stand-in weights
        choice = current().small_batch  # outside any model: the defaults'
        assert choice.source == "synthetic"
        matmul.choose_small_batch_call(sample)
        assert (choice.source, choice.timed_bytes) == ("sample", 256 * 64 * 4)
        matmul.choose_small_batch_call(sample[:1] * 2)  # a larger sample: timed again
        assert (choice.source, choice.timed_bytes) == ("sample", 2 * 256 * 64 * 4)
        matmul.choose_small_batch_call(sample)  # a smaller one: kept
        assert (choice.source, choice.timed_bytes) == ("sample", 2 * 256 * 64 * 4)
    finally:
        set_small_batch_call(None)


def test_a_shared_call_is_kept_unless_a_plain_call_is_clearly_faster_on_the_sample():
    pick = matmul._pick_small_batch_call
    untimed = float("inf")  # numba missing: the compiled call is not timed
    assert pick({"weight_left": 1.0, "weight_right": 1.5, "row_blocks": 1.2, "compiled": untimed}) == "row_blocks"
    assert pick({"weight_left": 1.0, "weight_right": 0.9, "row_blocks": 1.2, "compiled": untimed}) == "weight_right"
    assert pick({"weight_left": 2.0, "weight_right": 3.0, "row_blocks": 1.0, "compiled": untimed}) == "row_blocks"


def test_the_compiled_call_is_kept_unless_row_blocks_is_clearly_faster():
    pick = matmul._pick_small_batch_call
    assert pick({"weight_left": 2.0, "weight_right": 2.0, "row_blocks": 1.0, "compiled": 1.2}) == "compiled"
    assert pick({"weight_left": 2.0, "weight_right": 2.0, "row_blocks": 1.0, "compiled": 1.3}) == "row_blocks"
    assert pick({"weight_left": 1.0, "weight_right": 2.0, "row_blocks": 3.0, "compiled": 1.3}) == "weight_left"
