"""One sequence's decode step on its own path (kestrel_trio._model.decoder.decode_step) computes the general path's
logits.

Bit for bit: the step's one-call quantization (_kernels.portable.integer.quantize_rows) against the products' own,
and whole decode steps of every GGUF fixture in the integer mode against the general forward pass, alone and with
the products and attention shared among product threads (as compiled job tables, kestrel_trio._model.products.jobs,
and as Python tasks where there are none); the general path's small batches shared as job tables too.
Where the path does not apply (the exact products, a MoE, a bf16 cache) it declines and the general path runs.
"""

from __future__ import annotations

import gc
import json
import importlib
from pathlib import Path

import numpy as np
import pytest

from kestrel_trio import _kernels, load_model
from kestrel_trio.model import set_products
from kestrel_trio._model.decoder import decode_step as decode_step_module
from kestrel_trio._model.decoder import decode_share
from kestrel_trio._model.decoder import layers as decoder_layers
from kestrel_trio._model.products import matmul, share_choice
from kestrel_trio._model.products.share_choice import ShareChooser

pytestmark = pytest.mark.skipif(not _kernels.ready(), reason=_kernels.unavailable_reason())

forward_module = importlib.import_module("kestrel_trio._model.decoder.forward")  # the package exports the function
GGUF_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gguf"
DENSE = ["llama_quant", "qwen2_quant", "qwen3_quant"]  # Llama; Qwen2.5's q/k/v biases; Qwen3's head norms


def _rows(rng, n: int, cols: int) -> np.ndarray:
    x = (rng.standard_normal((n, cols)) * rng.uniform(0.1, 30, (n, 1))).astype(np.float32)  # [n, cols]
    x[0, :32] = 0  # a block of zeros: scale 0, quants 0
    return x


@pytest.mark.parametrize("sums", [False, True])
def test_the_step_s_quantization_is_the_products_own(sums):
    from kestrel_trio._kernels.portable import integer

    rng = np.random.default_rng(7)
    for n, cols in ((1, 576), (3, 64), (1, 1536)):
        x = _rows(rng, n, cols)
        x[0, 32:64] = rng.standard_normal(32) * 1e-30  # tiny values: the scale's division and rounding
        want_q, want_d = np.empty((n, cols), np.int8), np.empty((n, cols // 32), np.float32)
        integer.quantize_q8_rows(x, 32, want_q, want_d)
        want_s = np.empty_like(want_d)
        integer.block_sums(want_q, want_d, 32, want_s)
        xq, xd, xs = np.empty_like(want_q), np.empty_like(want_d), np.full_like(want_d, -1.0)
        integer.quantize_rows(x, 32, xq, xd, xs, sums)
        assert np.array_equal(xq, want_q) and np.array_equal(xd, want_d)
        assert np.array_equal(xs, want_s) if sums else (xs == -1).all()  # sums only where asked
        assert (xd[0, 0] == 0 and (xq[0, :32] == 0).all()) and np.abs(xq).max() == 127


def _decode(name: str, fast: bool, monkeypatch, steps: int = 6) -> tuple[np.ndarray, int]:
    """[steps, vocab] logits of greedy decode steps after the fixture's prompt, and how many took the own path."""
    golden = np.load(GGUF_FIXTURES / name / "golden.npz")
    model = load_model(GGUF_FIXTURES / name / f"{name}.gguf")
    taken = []
    counted = _counting(decode_step_module.decode_step, taken)
    monkeypatch.setattr(forward_module, "decode_step", counted if fast else (lambda *args: None))
    cache = model.new_cache()
    logits = model.prefill(cache, np.asarray(golden["prompt_ids"]))
    rows = []
    for _ in range(steps):
        logits = model.step(cache, [int(np.argmax(logits))])
        rows.append(logits)
    return np.stack(rows), sum(taken)  # [steps, vocab]


def _counting(function, found: list):
    """``function`` that also notes in ``found`` whether each call gave something (not None)."""
    def counted(*args):
        result = function(*args)
        found.append(result is not None)
        return result
    return counted


@pytest.fixture
def integer_mode():
    set_products("integer")  # the models loaded in the test take it
    yield
    set_products("exact")


@pytest.mark.parametrize("name", DENSE)
def test_a_decode_step_on_its_own_path_is_the_general_one_bit_for_bit(name, integer_mode, monkeypatch):
    general, taken = _decode(name, False, monkeypatch)
    assert taken == 0
    fast, taken = _decode(name, True, monkeypatch)
    assert taken == len(fast)  # every step took the own path
    assert np.array_equal(fast, general)


@pytest.mark.parametrize("name", ["qwen3_quant"])
def test_shared_or_alone_as_timings_choose_it_is_the_same(name, integer_mode, monkeypatch):
    """Every kind of product tried both ways within the steps (a burst the other way every other product)."""
    general, _ = _decode(name, False, monkeypatch)
    monkeypatch.setattr(matmul, "SHARE_MIN_ELEMENTS", 0)
    made = []

    monkeypatch.setattr(share_choice, "EXPLORE_EVERY", 2)
    monkeypatch.setattr(share_choice, "BURST", 2)

    def eager_choosers():
        found = {kind: ShareChooser(prefer_shared=True) for kind in decode_share.KINDS}
        made.append(found)
        return found

    monkeypatch.setattr(decode_step_module, "choosers", eager_choosers)
    # Python tasks through the queue, as where the kernels have no compiled job entry (decode_jobs)
    monkeypatch.setattr(decode_step_module, "job_rows", lambda *args: None)
    assert np.array_equal(_decode_on_two_threads(name, monkeypatch), general)
    used = {kind: chooser.costs() for found in made for kind, chooser in found.items() if chooser._cost != {
        False: None, True: None}}  # the fixture's kinds with an integer product (not all its matrices have one)
    assert "qkv" in used and all(None not in cost.values() for cost in used.values()), used


@pytest.mark.parametrize("name", DENSE)
def test_shared_among_product_threads_it_is_the_same(name, integer_mode, monkeypatch):
    general, _ = _decode(name, False, monkeypatch)
    monkeypatch.setattr(matmul, "SHARE_MIN_ELEMENTS", 0)  # the fixtures' tiny matrices shared too
    monkeypatch.setattr(decoder_layers, "SHARED_DECODE_SCORES", 0)  # and their attention
    tables = []
    monkeypatch.setattr(decode_step_module, "job_rows", _counting(decode_step_module.job_rows, tables))
    assert np.array_equal(_decode_on_two_threads(name, monkeypatch), general)
    # the products went as compiled job tables (_kernels.portable.handoff), where the CPU has its own kernels
    own = _kernels.integer_job("Q8_0", "integer") is not None
    assert any(tables) == own, tables


@pytest.mark.parametrize("name", DENSE)
def test_the_general_path_shared_as_compiled_jobs_is_the_same(name, integer_mode, monkeypatch):
    """The prompt's rows and the general path's steps (up to FUSED_MAX_ROWS rows a product) shared among two
    product threads as job tables give one thread's logits bit for bit."""
    general, _ = _decode(name, False, monkeypatch)
    monkeypatch.setattr(matmul, "SHARE_MIN_ELEMENTS", 0)
    made = []
    monkeypatch.setattr(matmul, "matrix_job_rows", _counting(matmul.matrix_job_rows, made))
    matmul.set_product_threads(2)
    try:
        shared, _ = _decode(name, False, monkeypatch)
    finally:
        matmul.set_product_threads(1)
    assert np.array_equal(shared, general)
    assert any(made) == (_kernels.integer_job("Q8_0", "integer") is not None), made


def _decode_on_two_threads(name, monkeypatch) -> np.ndarray:
    """The decode step's logits with two product threads, every step taken by the decode step's own path."""
    matmul.set_product_threads(2)
    try:
        fast, taken = _decode(name, True, monkeypatch)
    finally:
        matmul.set_product_threads(1)
    assert taken == len(fast)
    return fast


def test_it_declines_the_exact_products_a_moe_and_a_bf16_cache(integer_mode, monkeypatch):
    _, taken = _decode("qwen3moe_quant", True, monkeypatch)
    assert taken == 0  # sparse experts: the general path
    model = load_model(GGUF_FIXTURES / "llama_quant" / "llama_quant.gguf")
    cache = model.new_cache(dtype="bf16")
    model.prefill(cache, np.array([1, 2, 3]))
    assert decode_step_module.decode_step(model.decoder, 4, cache.length, cache) is None
    set_products("exact")
    _, taken = _decode("llama_quant", True, monkeypatch)
    assert taken == 0  # no integer product: nothing for this path to save


def test_a_model_s_plan_goes_with_it(integer_mode):
    model = load_model(GGUF_FIXTURES / "llama_quant" / "llama_quant.gguf")
    cache = model.new_cache()
    model.prefill(cache, np.array([1, 2, 3]))
    before = len(decode_step_module._plans)
    assert decode_step_module.decode_step(model.decoder, 4, cache.length, cache) is not None
    assert len(decode_step_module._plans) == before + 1
    del model
    gc.collect()
    assert len(decode_step_module._plans) == before  # the plan held no reference to its model


def test_smollm2_answers_paris_on_its_own_path_as_on_the_general_one(integer_mode, monkeypatch):
    from real_models import smollm2_135m

    meta = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "smollm2" / "smollm2_golden.json")
                      .read_text(encoding="utf-8"))
    prompt = meta["prompts"][0]
    assert prompt["question"] == "What is the capital of France?"
    model = load_model(smollm2_135m())  # the shipped Q4_1 file, its head Q8_0: every matrix integer here
    answers = {}
    for fast in (False, True):
        taken = []
        real = decode_step_module.decode_step
        monkeypatch.setattr(forward_module, "decode_step",
                            (lambda *args: taken.append(1) or real(*args)) if fast else (lambda *args: None))
        cache = model.new_cache()
        logits = model.prefill(cache, prompt["prompt_ids"])
        rows, answer = [], []
        while len(answer) < meta["max_new_tokens"] and (not answer or answer[-1] not in model.tokenizer.eos_token_ids):
            answer.append(int(np.argmax(logits)))
            logits = model.step(cache, [answer[-1]])
            rows.append(logits)
        answers[fast] = (answer, np.stack(rows))  # [steps, vocab]
        assert len(taken) == (len(rows) if fast else 0)
    assert answers[True][0] == answers[False][0] and np.array_equal(answers[True][1], answers[False][1])
    assert "Paris" in model.decode(answers[True][0])


def test_a_one_token_step_asking_for_hidden_rows_takes_the_general_path(integer_mode):
    """Embeddings pool the final hidden states: a one-token input must not get the decode step's logits."""
    model = load_model(GGUF_FIXTURES / "qwen3_quant" / "qwen3_quant.gguf")
    first_step = model.new_cache()  # a new cache too: the step must not read buffers it has not reserved
    hidden = forward_module.forward(model.decoder, np.asarray([5]), np.asarray([0]), [first_step], [1], hidden=True)
    logits = forward_module.forward(model.decoder, np.asarray([5]), np.asarray([0]), [model.new_cache()], [1])
    assert hidden.shape == (1, model.config.hidden_size)  # [1, hidden]
    assert logits.shape == (1, model.config.vocab_size)  # [1, vocab]: the decode step's
