"""Qwen3-VL from llama.cpp's GGUF pair (language model + mmproj) against transformers on the same weights.

The files are the tiny Qwen3-VL fixture converted by llama.cpp's own converter, and the goldens come from
transformers with every weight replaced by the files' tensors (tests/fixtures/make_vl_gguf_fixtures.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from kestrel_trio import load_model
from kestrel_trio._model import GgufFile, load_qwen3_vl_gguf, vl_config_from_gguf
from kestrel_trio.errors import BadRequestError, ModelLoadError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PAIR = FIXTURES / "qwen3_vl_gguf"
LM = PAIR / "lm-f16.gguf"
MMPROJ = {kind: PAIR / f"mmproj-{kind}.gguf" for kind in ("f16", "bf16", "q8_0")}
RTOL = 1e-4  # relative to the largest logit of the prompt


@pytest.fixture(scope="module")
def reference():
    """The prompts' inputs (vl_golden.npz of the folder fixture) and the GGUF pairs' goldens."""
    return np.load(FIXTURES / "qwen3_vl" / "vl_golden.npz"), np.load(PAIR / "gguf_golden.npz")


def logits_and_greedy(vl, inputs, key: str, new_tokens: int) -> tuple[np.ndarray, list[int]]:
    """All prompt logits [T, vocab] of one prefill, then ``new_tokens`` greedy tokens through the KV cache."""
    if key == "video":
        prompt = vl.prepare(inputs["video_input_ids"], pixel_values_videos=inputs["pixel_values_videos"],
                            video_grid_thw=inputs["video_grid_thw"])
    else:
        pixels = (inputs["pixel_values_up"], inputs["image_image_grid_thw"]) if key == "image" else (None, None)
        prompt = vl.prepare(inputs[f"{key}_input_ids"], *pixels)
    cache = vl.new_cache()
    logits = vl.prefill(cache, prompt, all_logits=True)  # [T, vocab]
    tokens = [int(np.argmax(logits[-1]))]
    while len(tokens) < new_tokens:
        tokens.append(int(np.argmax(vl.step(cache, np.array([tokens[-1]]), prompt.rope_delta))))
    return logits, tokens


@pytest.mark.parametrize("residency", ["gguf", "fp32"])
@pytest.mark.parametrize("kind", ["f16", "bf16", "q8_0"])
@pytest.mark.parametrize("key", ["image", "text", "video"])
def test_the_pair_reproduces_transformers_on_its_weights(reference, kind: str, residency: str, key: str) -> None:
    inputs, golden = reference
    inputs = {**inputs, **golden}  # the video prompt's inputs live beside its goldens
    vl = load_qwen3_vl_gguf(LM, MMPROJ[kind], residency=residency)
    want = golden[f"{kind}_{key}_logits"]
    greedy = golden[f"{kind}_{key}_greedy_ids"]
    logits, tokens = logits_and_greedy(vl, inputs, key, len(greedy))
    np.testing.assert_allclose(logits, want, rtol=0, atol=RTOL * float(np.abs(want).max()))
    assert tokens == greedy.tolist()


def test_a_video_on_the_folder_reproduces_transformers(reference) -> None:
    """The same video prompt on the folder checkpoint's own float32 weights (load_qwen3_vl)."""
    from kestrel_trio._model import load_qwen3_vl

    _, golden = reference
    vl = load_qwen3_vl(FIXTURES / "qwen3_vl")
    want = golden["folder_video_logits"]
    logits, tokens = logits_and_greedy(vl, golden, "video", len(golden["folder_video_greedy_ids"]))
    np.testing.assert_allclose(logits, want, rtol=0, atol=RTOL * float(np.abs(want).max()))
    assert tokens == golden["folder_video_greedy_ids"].tolist()


def test_a_video_is_one_run_of_pads_per_temporal_patch(reference) -> None:
    """Two temporal patches of a 4x6 grid: two runs of 6 pads, each placed as a one-frame image, with the
    timestamp text between them counted as text (transformers' get_rope_index)."""
    from kestrel_trio._model.vision.qwen3_vl import rope_index

    _, golden = reference
    ids = golden["video_input_ids"]
    positions, delta = rope_index(ids, None, image_token_id=511, spatial_merge_size=2,
                                  video_grid_thw=golden["video_grid_thw"], video_token_id=512)
    runs = np.flatnonzero(np.diff(np.concatenate([[0], (ids == 512).astype(int), [0]])))  # run starts, ends
    assert len(runs) == 4  # two runs
    for start, end in zip(runs[::2], runs[1::2]):
        t, h, w = positions[:, start:end]  # [run] each
        assert end - start == 6 and (t == t[0]).all()
        assert (h - h.min()).tolist() == [0, 0, 0, 1, 1, 1] and (w - w.min()).tolist() == [0, 1, 2, 0, 1, 2]
    assert delta == int(positions.max()) + 1 - ids.size
    with pytest.raises(BadRequestError, match=re.escape("the prompt has more <|video_pad|> runs than video grids (1)")):
        rope_index(ids, None, image_token_id=511, spatial_merge_size=2, video_grid_thw=np.array([[1, 4, 6]]),
                   video_token_id=512)


def test_the_image_moves_the_logits(reference) -> None:
    """The image prompt's goldens are not the text prompt's: a tower that did nothing would fail the test above."""
    _, golden = reference
    assert golden["f16_image_logits"].shape != golden["f16_text_logits"].shape
    assert golden["f16_image_greedy_ids"].tolist() != golden["f16_text_greedy_ids"].tolist()


def test_the_tower_keeps_the_stored_types() -> None:
    """weights="gguf": every mmproj matrix but the two-part patch kernel stays in the file's type."""
    from kestrel_trio._model import packed_matrices

    vl = load_qwen3_vl_gguf(LM, MMPROJ["q8_0"], residency="gguf")
    forms = {part.form for matrix in packed_matrices(vl.vision) for part in matrix.parts}
    assert forms == {"Q8_0"}
    assert isinstance(vl.vision.patch_weight, np.ndarray) and vl.vision.patch_weight.shape == (32, 1536)


def test_config_comes_from_both_headers() -> None:
    config = vl_config_from_gguf(GgufFile(LM), GgufFile(MMPROJ["f16"]))
    assert config.mrope_section == (6, 5, 5)
    assert (config.image_token_id, config.video_token_id) == (511, 512)
    assert (config.vision_start_token_id, config.vision_end_token_id) == (509, 510)
    v = config.vision
    assert (v.depth, v.hidden_size, v.intermediate_size, v.num_heads) == (3, 32, 64, 2)
    assert (v.patch_size, v.temporal_patch_size, v.spatial_merge_size, v.out_hidden_size) == (16, 2, 2, 64)
    assert v.num_position_embeddings == 49 and v.deepstack_visual_indexes == (0, 1)
    assert v.hidden_act == "gelu_pytorch_tanh"


def test_load_model_takes_the_pair() -> None:
    model = load_model(LM, mmproj=MMPROJ["f16"])
    assert model.vision is not None and model.name == "lm-f16"
    assert model.weights_mode == "gguf"
    image = model.image_config
    assert (image.patch_size, image.merge_size, image.temporal_patch_size) == (16, 2, 2)
    assert image.image_mean == pytest.approx((0.48145466, 0.4578275, 0.40821073))  # the fixture's CLIP stats
    assert image.image_std == pytest.approx((0.26862954, 0.26130258, 0.27577711))
    assert (image.min_pixels, image.max_pixels) == (65536, 16777216)  # Qwen3-VL's published bounds
    assert model.has_chat_template


def test_the_language_model_alone_serves_text(reference) -> None:
    inputs, golden = reference
    model = load_model(LM)
    assert model.vision is None
    vl = load_qwen3_vl_gguf(LM, MMPROJ["f16"])
    ids = inputs["text_input_ids"]
    from kestrel_trio._model import forward

    cache = model.decoder.new_cache()
    logits = forward(model.decoder, ids, np.arange(ids.size), [cache], [ids.size], all_logits=True)
    want = golden["f16_text_logits"]
    np.testing.assert_allclose(logits, want, rtol=0, atol=RTOL * float(np.abs(want).max()))
    assert vl.config.text == model.config


# --------------------------------------------------------------------------- errors


def test_mmproj_with_a_folder_is_refused() -> None:
    with pytest.raises(ModelLoadError, match=r"qwen3_vl: an mmproj file goes with a GGUF language model file, and this "
                                             r"is a folder"):
        load_model(FIXTURES / "qwen3_vl", mmproj=MMPROJ["f16"])


def test_a_missing_mmproj_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="nothing.gguf: no such mmproj file"):
        load_model(LM, mmproj=tmp_path / "nothing.gguf")


def test_mmproj_with_a_text_model_is_refused() -> None:
    text = FIXTURES / "gguf" / "qwen3_quant" / "qwen3_quant.gguf"
    with pytest.raises(ModelLoadError, match=r"qwen3_quant.gguf: an mmproj file needs a Qwen3-VL language model "
                                             r"\(GGUF architecture 'qwen3vl'\), this one is 'qwen3'"):
        load_model(text, mmproj=MMPROJ["f16"])


def test_the_two_files_swapped_are_refused() -> None:
    with pytest.raises(ModelLoadError, match="lm-f16.gguf: not an mmproj file: general.architecture is 'qwen3vl', "
                                             "not 'clip'"):
        load_model(MMPROJ["f16"], mmproj=LM)


gguf_kit = pytest.importorskip("gguf_kit")  # needs gguf to rewrite files


@pytest.mark.parametrize(("change", "message"), [
    ({"clip.vision.projection_dim": 128}, r"mmproj.gguf: clip.vision.projection_dim 128 differs from the language "
                                          r"model's width 64 \(lm-f16.gguf\): this mmproj file is not for this model"),
    ({"clip.projector_type": "qwen2vl_merger"}, r"mmproj.gguf: clip.projector_type is 'qwen2vl_merger'; kestrel-trio "
                                                r"reads only Qwen3-VL's vision tower \('qwen3vl_merger'\)"),
    ({"clip.vision.is_deepstack_layers": [True, False, False]},
     r"mmproj.gguf: 1 deepstack layers, but lm-f16.gguf's qwen3vl.n_deepstack_layers is 2"),
    ({"clip.vision.block_count": 4}, r"mmproj.gguf: clip.vision.is_deepstack_layers has 3 entries, "
                                     r"clip.vision.block_count is 4"),
    ({"clip.vision.block_count": None}, r"mmproj.gguf: GGUF metadata key clip.vision.block_count is missing"),
])
def test_a_mismatched_mmproj_is_named(tmp_path: Path, change: dict, message: str) -> None:
    bad = gguf_kit.rewrite_gguf(MMPROJ["f16"], tmp_path / "mmproj.gguf", metadata=change)
    with pytest.raises(ModelLoadError, match=message):
        load_model(LM, mmproj=bad)


@pytest.mark.parametrize(("drop", "message"), [
    ("v.blk.2.attn_qkv.weight", r"mmproj.gguf: tensor 'v.blk.2.attn_qkv.weight' "
                                r"\(model.visual.blocks.2.attn.qkv.weight\) is missing"),
    ("v.deepstack.1.fc2.bias", r"mmproj.gguf: tensor 'v.deepstack.1.fc2.bias' "
                               r"\(model.visual.deepstack_merger_list.1.linear_fc2.bias\) is missing"),
    ("v.patch_embd.weight.1", r"mmproj.gguf: tensor 'v.patch_embd.weight.1' is missing \(kestrel-trio reads "
                              r"Qwen3-VL's temporal patch of 2 frames\)"),
])
def test_a_missing_tower_tensor_is_named(tmp_path: Path, drop: str, message: str) -> None:
    bad = gguf_kit.rewrite_gguf(MMPROJ["f16"], tmp_path / "mmproj.gguf", drop=(drop,))
    with pytest.raises(ModelLoadError, match=message):
        load_model(LM, mmproj=bad)


def test_an_unexpected_or_misshapen_tensor_is_named(tmp_path: Path) -> None:
    extra = gguf_kit.rewrite_gguf(MMPROJ["f16"], tmp_path / "extra.gguf",
                                  tensors={"v.blk.3.ln1.weight": np.ones(32, dtype=np.float32)})
    with pytest.raises(ModelLoadError, match=r"extra.gguf: unexpected tensor 'v.blk.3.ln1.weight'"):
        load_model(LM, mmproj=extra)
    short = gguf_kit.rewrite_gguf(
        MMPROJ["f16"], tmp_path / "short.gguf",
        transform=lambda t: np.ones(16, dtype=np.float32) if t.name == "mm.2.bias" else None)
    with pytest.raises(ModelLoadError, match=r"short.gguf: tensor 'mm.2.bias' \(model.visual.merger.linear_fc2.bias\) "
                                             r"has shape \[16\], the metadata implies \[64\]"):
        load_model(LM, mmproj=short)


def test_a_tower_too_large_is_refused_before_allocating(tmp_path: Path) -> None:
    huge = gguf_kit.rewrite_gguf(MMPROJ["f16"], tmp_path / "huge.gguf",
                                 metadata={"clip.vision.embedding_length": 1 << 30})
    with pytest.raises(ModelLoadError, match=r"huge.gguf \(mmproj metadata\): field 'hidden_size' is 1073741824, "
                                             r"above the most kestrel-trio accepts"):
        load_model(LM, mmproj=huge)
