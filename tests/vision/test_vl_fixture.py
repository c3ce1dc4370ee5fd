"""The numpy Qwen3-VL against transformers' goldens (tests/fixtures/make_vl_fixtures.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from kestrel_trio import BadRequestError, ModelLoadError, load_model
from kestrel_trio._model import forward
from kestrel_trio._model.vision.qwen3_vl import _forward_with_images, load_qwen3_vl, mrope_cos_sin, rope_index
from kestrel_trio._model.vision.qwen3_vl_config import read_vl_config, vl_config_from_dict
from kestrel_trio._model.checkpoints.safetensors import SafetensorsCheckpoint, save_safetensors
from kestrel_trio._model.vision.tower import ImageFeatures
from kestrel_trio._model.weights.assemble import Bf16Matrix

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PROMPTS = {"text": (), "image": ("up",), "two_images": ("up", "tall")}
RTOL = 1e-4


# The bf16 variant has no two-image goldens (fixture size).
CASES = [("qwen3_vl", key) for key in PROMPTS] + [("qwen3_vl_bf16", "text"), ("qwen3_vl_bf16", "image")]
_LOADED: dict = {}


def _load(name):
    if name not in _LOADED:
        _LOADED[name] = load_qwen3_vl(FIXTURES / name), np.load(FIXTURES / name / "vl_golden.npz")
    return _LOADED[name]


@pytest.fixture(scope="module", params=["qwen3_vl", "qwen3_vl_bf16"])
def loaded(request):
    return _load(request.param)


@pytest.fixture(scope="module")
def pixels():
    return np.load(FIXTURES / "qwen3_vl" / "vl_golden.npz")


def _prompt(model, golden, pixels, key):
    images = PROMPTS[key]
    if not images:
        return model.prepare(golden[f"{key}_input_ids"])
    values = np.concatenate([pixels[f"pixel_values_{n}"] for n in images])
    return model.prepare(golden[f"{key}_input_ids"], values, golden[f"{key}_image_grid_thw"])


def _greedy(model, prompt, n, chunk=None):
    cache = model.new_cache()
    size = prompt.token_ids.size
    for start in range(0, size, chunk or size):
        logits = model.prefill(cache, prompt, start, min(size, start + (chunk or size)))
    out = []
    while len(out) < n:
        out.append(int(np.argmax(logits)))
        logits = model.step(cache, [out[-1]], prompt.rope_delta)
    return out


@pytest.mark.parametrize("name, key", CASES)
def test_logits_equal_transformers(pixels, name, key):
    model, golden = _load(name)
    logits = model.prefill(model.new_cache(), _prompt(model, golden, pixels, key), all_logits=True)
    expected = golden[f"{key}_logits"]
    assert logits.shape == expected.shape
    assert np.abs(logits - expected).max() <= RTOL * np.abs(expected).max()


@pytest.mark.parametrize("name, key", CASES)
def test_greedy_continuation_equals_transformers(pixels, name, key):
    model, golden = _load(name)
    prompt = _prompt(model, golden, pixels, key)
    assert _greedy(model, prompt, 16) == golden[f"{key}_greedy_ids"].tolist()


@pytest.mark.parametrize("chunk", [5, 32])
def test_chunked_prefill_through_images_matches(pixels, chunk):
    model, golden = _load("qwen3_vl")
    prompt = _prompt(model, golden, pixels, "two_images")
    assert _greedy(model, prompt, 16, chunk=chunk) == golden["two_images_greedy_ids"].tolist()


def test_the_image_changes_the_answer(loaded):
    _, golden = loaded
    assert golden["image_greedy_ids"].tolist() != golden["text_greedy_ids"].tolist()


def test_image_loop_without_images_equals_the_text_path(loaded):
    # With no image rows, the overrides (M-RoPE angles from equal positions) change nothing.
    model, golden = loaded
    ids = golden["text_input_ids"]
    positions = np.broadcast_to(np.arange(ids.size), (3, ids.size))
    empty = np.zeros((0, model.config.text.hidden_size), dtype=np.float32)
    features = ImageFeatures(embeds=empty, deepstack=(empty, empty))
    mine = _forward_with_images(model, ids, positions, model.new_cache(), np.zeros(0, np.int64), features, True)
    text = forward(model.decoder, ids, np.arange(ids.size), [model.new_cache()], [ids.size], all_logits=True)
    np.testing.assert_allclose(mine, text, rtol=1e-5, atol=1e-5 * np.abs(text).max())


def test_equal_positions_give_plain_rope(loaded):
    model, _ = loaded
    positions = np.arange(10)
    cos, sin = mrope_cos_sin(model.decoder.rope, np.stack([positions] * 3), model.config.mrope_section)
    plain_cos, plain_sin = model.decoder.rope.cos_sin(positions)
    assert np.array_equal(cos, plain_cos) and np.array_equal(sin, plain_sin)


def test_rope_index_text_only_is_one_dimensional():
    positions, delta = rope_index(np.array([5, 6, 7, 8]), None, image_token_id=9, spatial_merge_size=2)
    assert positions.tolist() == [[0, 1, 2, 3]] * 3 and delta == 0


def test_rope_index_lays_an_image_out_by_row_and_column():
    # 2 text tokens, a 4x6-patch image (2x3 tokens after the 2x2 merge), 2 text tokens.
    ids = np.array([1, 2] + [9] * 6 + [3, 4])
    positions, delta = rope_index(ids, np.array([[1, 4, 6]]), image_token_id=9, spatial_merge_size=2)
    assert positions[0].tolist() == [0, 1, 2, 2, 2, 2, 2, 2, 5, 6]
    assert positions[1].tolist() == [0, 1, 2, 2, 2, 3, 3, 3, 5, 6]
    assert positions[2].tolist() == [0, 1, 2, 3, 4, 2, 3, 4, 5, 6]
    assert delta == 7 - 10


@pytest.mark.parametrize("grids, ids", [
    (np.array([[1, 4, 6]]), [1] + [9] * 5 + [2]),  # one pad short
    (np.array([[1, 2, 2], [1, 2, 2]]), [1, 9, 2]),  # two images, one run
    (None, [1, 9, 2]),  # a run with no image
])
def test_rope_index_rejects_pads_that_do_not_match(grids, ids):
    with pytest.raises(BadRequestError):
        rope_index(np.array(ids), grids, image_token_id=9, spatial_merge_size=2)


def test_both_config_styles_read_alike():
    new = read_vl_config(FIXTURES / "qwen3_vl")  # transformers 5: rope_parameters
    old = read_vl_config(FIXTURES / "qwen3_vl_bf16")  # transformers 4: rope_theta + rope_scaling
    for config in (new, old):
        assert config.mrope_section == (6, 5, 5) and config.text.rope.rope_theta == 1e6
        assert config.vision.deepstack_visual_indexes == (0, 1) and config.image_token_id == 511
    assert (new.text.tie_word_embeddings, old.text.tie_word_embeddings) == (False, True)


def test_bad_mrope_section_is_named():
    raw = json.loads((FIXTURES / "qwen3_vl" / "config.json").read_text())
    raw["text_config"]["rope_parameters"]["mrope_section"] = [6, 5, 6]
    with pytest.raises(ModelLoadError, match="mrope_section"):
        vl_config_from_dict(raw)


def _broken_copy(tmp_path, edit):
    folder = tmp_path / "broken"
    shutil.copytree(FIXTURES / "qwen3_vl", folder)
    checkpoint = SafetensorsCheckpoint(folder)
    tensors = {name: checkpoint.read(name).copy() for name in checkpoint.tensors}
    edit(tensors)
    save_safetensors(folder / "model.safetensors", tensors)
    with pytest.raises(ModelLoadError) as info:
        load_qwen3_vl(folder)
    return str(info.value)


def test_missing_vision_tensor_is_named(tmp_path):
    message = _broken_copy(tmp_path, lambda t: t.pop("model.visual.blocks.1.attn.qkv.bias"))
    assert "'model.visual.blocks.1.attn.qkv.bias' is missing" in message


def test_misshapen_deepstack_tensor_is_named(tmp_path):
    def edit(tensors):
        tensors["model.visual.deepstack_merger_list.0.norm.weight"] = np.ones(32, np.float32)

    message = _broken_copy(tmp_path, edit)
    assert "'model.visual.deepstack_merger_list.0.norm.weight' has shape [32]" in message


def test_unexpected_tensor_is_named(tmp_path):
    def edit(tensors):
        tensors["model.visual.deepstack_merger_list.2.norm.weight"] = np.ones(128, np.float32)

    assert "unexpected tensor 'model.visual.deepstack_merger_list.2.norm.weight'" in _broken_copy(tmp_path, edit)


def test_text_tensor_under_the_qwen3_name_is_rejected(tmp_path):
    def edit(tensors):
        tensors["model.norm.weight"] = tensors.pop("model.language_model.norm.weight")

    assert "'model.language_model.norm.weight' is missing" in _broken_copy(tmp_path, edit)


def test_qwen2_vl_era_mrope_rope_type_reads_as_default():
    raw = json.loads((FIXTURES / "qwen3_vl_bf16" / "config.json").read_text())
    raw["text_config"]["rope_scaling"] = {"type": "mrope", "mrope_section": [6, 5, 5]}
    config = vl_config_from_dict(raw)
    assert config.text.rope.rope_type == "default" and config.mrope_section == (6, 5, 5)


def test_deepstack_index_beyond_depth_is_named():
    raw = json.loads((FIXTURES / "qwen3_vl" / "config.json").read_text())
    raw["vision_config"]["deepstack_visual_indexes"] = [0, 3]
    with pytest.raises(ModelLoadError, match="deepstack_visual_indexes"):
        vl_config_from_dict(raw)


@pytest.mark.parametrize("key", ["text", "image"])
def test_bf16_residency_gives_fp32_modes_logits(pixels, key):
    fp32, golden = _load("qwen3_vl_bf16")
    bf16 = load_qwen3_vl(FIXTURES / "qwen3_vl_bf16", residency="bf16")
    assert isinstance(bf16.decoder.weights.layers[0].attn.qkv_proj, Bf16Matrix)
    assert isinstance(bf16.vision.blocks[0].fc1_weight, Bf16Matrix)
    assert isinstance(bf16.vision.patch_weight, Bf16Matrix)
    expected = fp32.prefill(fp32.new_cache(), _prompt(fp32, golden, pixels, key), all_logits=True)
    got = bf16.prefill(bf16.new_cache(), _prompt(bf16, golden, pixels, key), all_logits=True)
    # The bits are upcast exactly; products of up to FUSED_MAX_ROWS rows (the vision tower's merged patches)
    # are compiled row products rather than BLAS, so they agree to float32 rounding, not bit for bit.
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5 * float(np.abs(expected).max()))
    assert _greedy(bf16, _prompt(bf16, golden, pixels, key), 16) == golden[f"{key}_greedy_ids"].tolist()


def test_load_model_applies_the_weights_mode_to_qwen3_vl(tmp_path):
    folder = tmp_path / "vl"
    shutil.copytree(FIXTURES / "qwen3_vl_bf16", folder)
    shutil.copy(FIXTURES / "qwen3_vl" / "preprocessor_config.json", folder)  # the same vision settings
    model = load_model(folder, weights="bf16")
    assert model.weights_mode == "bf16" and model.vision is not None
    assert isinstance(model.decoder.weights.lm_head, Bf16Matrix)
    with pytest.raises(ModelLoadError, match="weights"):
        load_qwen3_vl(folder, residency="fp16")


@pytest.mark.parametrize("key", ["text", "image"])
def test_int8_quantizes_the_language_model_and_keeps_the_vision_tower_bf16(pixels, key):
    from kestrel_trio._model.forms.packed import Int8Rows

    fp32, golden = _load("qwen3_vl_bf16")
    int8 = load_qwen3_vl(FIXTURES / "qwen3_vl_bf16", residency="int8")
    assert all(isinstance(p, Int8Rows) for p in int8.decoder.weights.layers[0].attn.qkv_proj.parts)
    assert isinstance(int8.vision.blocks[0].fc1_weight, Bf16Matrix)
    expected = fp32.prefill(fp32.new_cache(), _prompt(fp32, golden, pixels, key), all_logits=True)
    got = int8.prefill(int8.new_cache(), _prompt(int8, golden, pixels, key), all_logits=True)
    assert float(np.abs(got - expected).max()) <= 0.2 * float(np.abs(expected).max())  # as the text fixtures
