"""weights="gguf": a GGUF's matrices stay as stored (views of the mapped file) and are expanded only at use.

The products expand cache-sized chunks and may apply the blocks' scales to
partial sums (kestrel_trio._model.products.matmul); the logits must still equal those
of the model expanded to fp32 at load, and the goldens, within 1e-4 relative.
"""

from __future__ import annotations

import copy
import mmap
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf_kit import random_rows, rewrite_gguf

gguf = pytest.importorskip("gguf")  # quantizes the products' test weights

from kestrel_trio import _kernels, load_model
from kestrel_trio._model import forward
from kestrel_trio._model.decoder import layers
from kestrel_trio._model.products import matmul
from kestrel_trio._model.forms.dequant import GGML_TYPE_BY_NAME, expand_rows
from kestrel_trio._model.forms.packed import GgmlRows, PackedMatrix
from kestrel_trio._model.weights.residency import resident_bytes
from kestrel_trio._model.weights.assemble import DenseMLP
from kestrel_trio.errors import BadRequestError, ModelLoadError

GGUF_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gguf"
NAMES = sorted(p.name for p in GGUF_FIXTURES.iterdir() if (p / "golden.npz").exists())
TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]


def _file(name: str) -> Path:
    return GGUF_FIXTURES / name / f"{name}.gguf"


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max()) / max(1.0, float(np.abs(b).max()))


@pytest.fixture(scope="module", params=NAMES)
def both(request):
    """The fixture loaded as stored and expanded to fp32 at load, and its goldens."""
    stored = load_model(_file(request.param), weights="gguf")
    expanded = load_model(_file(request.param), weights="fp32")
    return request.param, stored, expanded, np.load(GGUF_FIXTURES / request.param / "golden.npz")


def test_auto_keeps_a_gguf_as_stored():
    assert load_model(_file("qwen3_quant")).weights_mode == "gguf"


def test_logits_equal_the_fp32_expanded_load_and_the_goldens_within_1e_4(both):
    _, stored, expanded, golden = both
    assert (stored.weights_mode, expanded.weights_mode) == ("gguf", "fp32")
    ids = golden["input_ids"].tolist()
    logits = stored.logits(ids)  # [T, vocab]
    assert _relative(logits, expanded.logits(ids)) <= 1e-4
    assert _relative(logits, golden["logits"]) <= 1e-4
    assert stored.greedy(golden["prompt_ids"].tolist(), 32) == golden["greedy_ids"].tolist()


def test_batched_decode_equals_one_sequence_at_a_time(both):
    """One row goes through the grouped products, 9 through expanded chunks: the same logits either way."""
    _, stored, _, golden = both
    prompts = [golden["input_ids"][i : i + 5].tolist() for i in range(9)]
    caches = [stored.new_cache() for _ in prompts]
    tokens = np.array([int(np.argmax(stored.prefill(c, p))) for c, p in zip(caches, prompts)])  # [9]
    for count in (1, 3, 9):
        alone = np.stack([stored.step(copy.deepcopy(c), [t]) for c, t in zip(caches[:count], tokens[:count])])
        positions = np.array([c.length for c in caches[:count]])  # [count]
        together = forward(stored.decoder, tokens[:count], positions, [copy.deepcopy(c) for c in caches[:count]],
                           [1] * count)  # [count, vocab]
        assert _relative(together, alone) <= 1e-4


def _mapped_base(array: np.ndarray):
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


def _matrices(weights):
    for layer in weights.layers:
        yield layer.attn.qkv_proj
        yield layer.attn.o_proj
        mlps = layer.mlp.experts if hasattr(layer.mlp, "experts") else (layer.mlp,)
        for mlp in mlps:
            yield mlp.gate_up_proj
            yield mlp.down_proj
    yield weights.embed_tokens
    yield weights.lm_head


def _expert_matrices(layer):
    for mlp in getattr(layer.mlp, "experts", ()):
        yield mlp.gate_up_proj
        yield mlp.down_proj


def _all_f32(tmp_path: Path, name: str) -> Path:
    """Fixture ``name`` rewritten with every tensor expanded to F32 (gguf's own dequantization)."""

    def expanded(tensor) -> np.ndarray:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        return values.reshape([int(d) for d in reversed(tensor.shape)])

    return rewrite_gguf(_file(name), tmp_path / f"{name}_f32.gguf", transform=expanded)


def test_an_f32_ggufs_matrices_are_plain_arrays_of_their_own(tmp_path):
    """Every matrix a step reads whole, in an all-F32 GGUF, is a float32 array out of the map (numpy's huge
    pages), q/k/v and gate/up fused into one each, as fp32 residency makes them; the untied embedding, looked
    up by row, stays mapped. The logits are the quantized file's expanded at load."""
    path = _all_f32(tmp_path, "qwen3_quant")
    model = load_model(path, weights="gguf")
    assert model.weights_mode == "gguf" and not model.config.tie_word_embeddings
    weights = model.decoder.weights
    matrices = list(_matrices(weights))
    assert all(isinstance(m, np.ndarray) and m.dtype == np.float32 and not m.flags.writeable for m in matrices)
    assert isinstance(_mapped_base(weights.embed_tokens), mmap.mmap)
    streamed = [m for m in matrices if m is not weights.embed_tokens]
    assert not any(isinstance(_mapped_base(m), mmap.mmap) for m in streamed)
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    expanded = load_model(_file("qwen3_quant"), weights="fp32")
    assert _relative(model.logits(ids), expanded.logits(ids)) <= 1e-5


@pytest.mark.parametrize("name", NAMES)
def test_nothing_is_expanded_at_load(name):
    """Every matrix is the file's blocks, mapped (llama's q/k: blocks gathered into transformers' row order).

    An F32 tensor is a float32 array: a copy of its own when every step reads it whole (huge pages rather
    than the page cache's), the mapped file where only some rows are read (an untied embedding, an expert).
    """
    model = load_model(_file(name), weights="gguf")
    weights = model.decoder.weights
    by_rows = {id(m) for layer in weights.layers for m in _expert_matrices(layer)}
    if not model.config.tie_word_embeddings:
        by_rows.add(id(weights.embed_tokens))
    copied = 0
    for matrix in _matrices(weights):
        if isinstance(matrix, np.ndarray):  # an F32 tensor
            assert isinstance(_mapped_base(matrix), mmap.mmap) == (id(matrix) in by_rows)
            assert not matrix.flags.writeable
            continue
        assert isinstance(matrix, PackedMatrix)
        for part in matrix.parts:
            assert isinstance(part, GgmlRows) and part.data.dtype == np.uint8 and not part.data.flags.writeable
            if isinstance(_mapped_base(part.data), mmap.mmap):
                continue
            assert name == "llama_quant" and part.data.flags.owndata  # the q/k row gather
            copied += part.data.nbytes
    # Bytes: the matrices hold exactly the file's matrix bytes (q/k copied once in llama, nothing expanded);
    # MoE routers ([n_experts, hidden], read by every token) are expanded to float32 at load, as vectors are.
    file_bytes = sum(t.nbytes for t in _gguf(name).tensors.values()
                     if len(t.shape) >= 2 and not t.name.endswith("ffn_gate_inp.weight"))
    held = sum(resident_bytes(weights).values())
    assert held == file_bytes
    assert (copied > 0) == (name == "llama_quant")
    # What is float32 and owned (expanded at load) is vectors only: norms, biases, routers.
    for layer in weights.layers:
        for vector in (layer.input_layernorm, layer.post_attention_layernorm):
            assert vector.ndim == 1


def _gguf(name: str):
    from kestrel_trio._model.gguf.reader import GgufFile

    return GgufFile(_file(name))


class _Expansions:
    """Records each (part, rows) a GgmlRows expansion writes, by the part's storage address.

    Expansions with numpy (GgmlRows.integer) and compiled ones (kestrel_trio._kernels' products, looked up per call
    or resolved once per weight (PartProduct), and expansions, which take the storage as GgmlRows.kernel_args gives
    it) alike.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[int, int, int]] = []
        original = GgmlRows.integer

        def integer(part, start, stop, out):
            self.calls.append((part.data.__array_interface__["data"][0], start, stop))
            return original(part, start, stop, out)

        monkeypatch.setattr(GgmlRows, "integer", integer)
        product, expand = _kernels.packed_product, _kernels.packed_expand

        def packed_product(form, data, scales, x, start, stop, out, quantized=None, *, mode="exact"):
            self.calls.append((data.__array_interface__["data"][0], start, stop))
            return product(form, data, scales, x, start, stop, out, quantized, mode=mode)

        def packed_expand(form, data, scales, start, stop, out):
            self.calls.append((data.__array_interface__["data"][0], start, stop))
            return expand(form, data, scales, start, stop, out)

        def resolved(part, x, start, stop, out, quantized=None):  # a weight's product resolved once (matmul)
            self.calls.append((part.data.__array_interface__["data"][0], start, stop))
            return call(part, x, start, stop, out, quantized)

        call = _kernels.PartProduct.__call__
        monkeypatch.setattr(_kernels, "packed_product", packed_product)
        monkeypatch.setattr(_kernels, "packed_expand", packed_expand)
        monkeypatch.setattr(_kernels.PartProduct, "__call__", resolved)


def _address(matrix: PackedMatrix) -> set[int]:
    return {p.data.__array_interface__["data"][0] for p in matrix.parts}


def test_moe_expands_only_the_routed_experts(monkeypatch):
    model = load_model(_file("qwen3moe_quant"), weights="gguf")
    config = model.decoder.config
    assert config.num_experts_per_tok < config.num_experts
    cache = model.new_cache()
    model.prefill(cache, [5, 17, 99, 3])
    routed: list[set[int]] = []
    original_moe = layers.sparse_moe

    def sparse_moe(x, moe, top_k, norm_topk_prob):
        logits = x @ moe.router.T  # [N, n_experts]
        routed.append({int(e) for e in np.argsort(-logits, axis=-1, kind="stable")[:, :top_k].reshape(-1)})
        return original_moe(x, moe, top_k, norm_topk_prob)

    monkeypatch.setattr(sys.modules["kestrel_trio._model.decoder.forward"], "sparse_moe", sparse_moe)
    expansions = _Expansions(monkeypatch)
    model.step(cache, [42])  # one decode step: one token
    expanded = {address for address, _, _ in expansions.calls}
    assert len(routed) == config.num_hidden_layers
    for layer, chosen in zip(model.decoder.weights.layers, routed):
        assert len(chosen) == config.num_experts_per_tok
        for j, expert in enumerate(layer.mlp.experts):
            touched = (_address(expert.gate_up_proj) | _address(expert.down_proj)) & expanded
            assert bool(touched) == (j in chosen), (j, chosen)


def test_an_embedding_lookup_expands_only_the_rows_looked_up(monkeypatch):
    model = load_model(_file("qwen3_quant"), weights="gguf")
    table = model.decoder.weights.embed_tokens
    expansions = _Expansions(monkeypatch)
    rows = layers.embedding(table, np.array([7, 300, 7]))  # [3, hidden]
    assert [stop - start for _, start, stop in expansions.calls] == [3]
    whole = table.dense()  # [vocab, hidden]
    assert np.array_equal(rows, whole[[7, 300, 7]])


def test_token_ids_outside_the_vocabulary_are_refused_not_read_from_an_empty_buffer():
    """A packed embedding left the rows of ids beyond its parts as np.empty had them (a different answer each run):
    the lookup refuses them, and the public Model's step and prefill name the field."""
    model = load_model(_file("qwen3_quant"), weights="gguf")
    vocab = model.config.vocab_size
    table = model.decoder.weights.embed_tokens
    assert isinstance(table, PackedMatrix)
    for bad in ([vocab], [-1], [3, vocab + 1000]):
        with pytest.raises(IndexError, match=f"outside 0..{vocab - 1}"):
            layers.embedding(table, np.array(bad))
        with pytest.raises(BadRequestError, match=f"'token_ids' has token ids outside 0..{vocab - 1}"):
            model.step(model.new_cache(), bad)
        with pytest.raises(BadRequestError, match="outside"):
            model.prefill(model.new_cache(), bad)


def _weights_as(name: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """Storage of type ``name`` for weights of a trained model's size (~0.02), uint8 [rows, row_bytes].

    gguf quantizes the types it can; K-quants are random valid blocks with such scales.
    """
    rng = np.random.default_rng(seed)
    t = GGML_TYPE_BY_NAME[name]
    if name in ("Q4_K", "Q5_K", "Q6_K"):
        blocks = rng.integers(0, 256, size=(rows * cols // t.block_size, t.type_size), dtype=np.uint8)
        d = rng.uniform(1e-4, 3e-4, size=(blocks.shape[0], 1)).astype(np.float16)
        blocks[:, 208:210] = d.view(np.uint8) if name == "Q6_K" else blocks[:, 208:210]
        if name != "Q6_K":
            blocks[:, 0:2] = d.view(np.uint8)
            blocks[:, 2:4] = (d * 8).astype(np.float16).view(np.uint8)
        return blocks.reshape(rows, -1)
    weights = rng.standard_normal((rows, cols)).astype(np.float32) * np.float32(0.02)
    return np.asarray(gguf.quants.quantize(weights, gguf.GGMLQuantizationType[name])).view(np.uint8).reshape(rows, -1)


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("batch", [1, 2, 8, 9, 40])
def test_products_equal_the_product_of_the_expanded_weights(name, batch, monkeypatch):
    """Every type, in chunks that straddle two parts, with scales on partial sums (few rows) or on the weights."""
    monkeypatch.setattr(matmul, "UPCAST_CHUNK", 7 * 512)  # 7 rows a chunk
    t, q8 = GGML_TYPE_BY_NAME[name], GGML_TYPE_BY_NAME["Q8_0"]
    first, second = _weights_as(name, 12, 512, seed=1), _weights_as("Q8_0", 9, 512, seed=2)
    matrix = PackedMatrix((GgmlRows(t, first), GgmlRows(q8, second)))
    dense = np.concatenate([expand_rows(t, first), expand_rows(q8, second)])  # [21, 512]
    assert np.array_equal(matrix.dense().view(np.uint32), dense.view(np.uint32))
    x = np.random.default_rng(batch).standard_normal((batch, 512)).astype(np.float32)  # [batch, 512]
    got = layers.linear(x, matrix)  # [batch, 21]
    want = x.astype(np.float64) @ dense.T.astype(np.float64)  # [batch, 21]
    bound = np.abs(x) @ np.abs(dense).T  # [batch, 21]: the sum of the terms' sizes
    assert np.all(np.abs(got - want) <= 1e-5 * bound + 1e-7)


def test_shared_products_agree_with_the_single_thread_ones():
    """Shared among threads, grouped forms take bigger chunks (fewer calls contending for the GIL):
    the same products to float32 rounding; a thread count gives the same result every time."""
    rng_rows = random_rows("Q4_K", 600, 1024, seed=5)
    matrix = PackedMatrix((GgmlRows(GGML_TYPE_BY_NAME["Q4_K"], rng_rows),))
    dense = matrix.dense()  # [600, 1024]
    for n in (1, 5, 12):
        x = np.random.default_rng(n).standard_normal((n, 1024)).astype(np.float32)  # [n, 1024]
        try:
            matmul.set_product_threads(1)
            alone = matmul.linear_packed(x, matrix)  # [n, 600]
            matmul.set_product_threads(3)
            shared = matmul.linear_packed(x, matrix)  # [n, 600]
            again = matmul.linear_packed(x, matrix)  # [n, 600]
        finally:
            matmul.set_product_threads(1)
        assert np.array_equal(shared, again)
        bound = np.abs(x) @ np.abs(dense).T  # [n, 600]
        assert np.all(np.abs(shared - alone) <= 1e-5 * bound)


def test_int8_or_int4_of_a_gguf_is_refused_with_what_to_use():
    with pytest.raises(ModelLoadError, match="weights=gguf"):
        load_model(_file("qwen3_quant"), weights="int8")


def test_the_dense_mlp_of_a_stored_model_is_fused(both):
    _, stored, _, _ = both
    mlp = stored.decoder.weights.layers[0].mlp
    mlp = mlp.experts[0] if not isinstance(mlp, DenseMLP) else mlp
    assert isinstance(mlp.gate_up_proj, PackedMatrix) and len(mlp.gate_up_proj.parts) == 2
