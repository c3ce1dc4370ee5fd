"""The memory table of docs/memory.md: resident weight bytes and KV bytes per model and form, and which boards fit.

Usage:
    python benchmarks/weights/memory_table.py [--context 4096] [--markdown]

Computed, not measured: every tensor the model's published config implies
(kestrel's own shape tables, kestrel_trio._model.checkpoints.shapes and .vision, from the
key numbers below, copied from each model's config.json on the Hugging Face
hub), times the bytes per weight of each form:

* fp32: 4 bytes a weight (kestrel's ``weights="fp32"``; the vision tower too).
* bf16: 2 bytes a weight (the published checkpoints' storage; kestrel's
  ``weights="bf16"``).
* Q8_0: 34 bytes per 32 weights, every matrix (llama.cpp's Q8_0 file).
* Q4_K_M: llama.cpp's ``llama-quantize`` Q4_K_M mix (src/llama-quant.cpp):
  Q4_K (144 bytes per 256) for every matrix but ``output.weight`` (and the
  embedding when tied to it: Q6_K, 210 bytes per 256) and, for the layers
  where ``use_more_bits(i, n) = i < n/8 or i >= 7n/8 or (i - n/8) % 3 == 2``,
  ``attn_v`` and ``ffn_down`` (experts included) in Q6_K. MoE routers stay F32.
* int8 / int4: kestrel's own quantization of a checkpoint folder
  (1 byte + a float32 scale per row; 0.5 byte + a float16 scale per 64).

Vectors (norms, biases) are float32 in every form (kestrel holds them so).
For Qwen3-VL, Q8_0 and Q4_K_M in the first table are the language model in
that format with the vision tower in 16 bits (llama.cpp's mmproj file as
usually published, F16); kestrel's int8/int4 likewise keep the tower in bf16.
The second table (``vl_gguf_table``) pairs each language-model GGUF with an
F16 or a Q8_0 mmproj file as ``--mmproj`` holds it (``--weights gguf``): the
tower's matrices as stored, the Conv3d patch kernel expanded to float32 (its
two halves joined), the position table and vectors float32.

KV cache: kestrel keeps keys and values in float32: layers x kv_heads x
head_dim x 2 x 4 bytes per token. A model fits a board when its weights,
``--context`` tokens of KV and ~1 GiB of runtime fit the board's memory less
1.5 GiB for the OS (the rule of docs/memory.md).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

GIB = 2**30
BOARDS_GIB = (8, 16, 32)
RUNTIME_GIB, OS_GIB = 1.0, 1.5
FORMS = ("fp32", "bf16", "Q8_0", "Q4_K_M", "int8", "int4")

# Key numbers of each model's published config.json (Qwen/<name> on the Hugging Face hub).
TEXT = {
    "Qwen3-0.6B": dict(hidden=1024, layers=28, heads=16, kv=8, head_dim=128, inter=3072, vocab=151936, tied=True),
    "Qwen3-1.7B": dict(hidden=2048, layers=28, heads=16, kv=8, head_dim=128, inter=6144, vocab=151936, tied=True),
    "Qwen3-4B": dict(hidden=2560, layers=36, heads=32, kv=8, head_dim=128, inter=9728, vocab=151936, tied=True),
    "Qwen3-8B": dict(hidden=4096, layers=36, heads=32, kv=8, head_dim=128, inter=12288, vocab=151936, tied=False),
    "Qwen3-30B-A3B": dict(hidden=2048, layers=48, heads=32, kv=4, head_dim=128, inter=6144, vocab=151936,
                          tied=False, experts=128, top_k=8, moe_inter=768),
    "Qwen3-VL-2B": dict(hidden=2048, layers=28, heads=16, kv=8, head_dim=128, inter=6144, vocab=151936, tied=True,
                        vision=dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16,
                                    out_hidden_size=2048, deepstack_visual_indexes=[5, 11, 17])),
    "Qwen3-VL-8B": dict(hidden=4096, layers=36, heads=32, kv=8, head_dim=128, inter=12288, vocab=151936, tied=False,
                        vision=dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16,
                                    out_hidden_size=4096, deepstack_visual_indexes=[8, 16, 24])),
}


def config_dict(key: dict) -> dict:
    """A config.json (the fields kestrel reads) with ``key``'s numbers."""
    text = {
        "vocab_size": key["vocab"], "hidden_size": key["hidden"], "num_hidden_layers": key["layers"],
        "num_attention_heads": key["heads"], "num_key_value_heads": key["kv"], "head_dim": key["head_dim"],
        "intermediate_size": key["inter"], "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": key["tied"], "rope_theta": 1000000.0,
    }
    if "experts" in key:
        text.update(architectures=["Qwen3MoeForCausalLM"], num_experts=key["experts"],
                    num_experts_per_tok=key["top_k"], moe_intermediate_size=key["moe_inter"], decoder_sparse_step=1,
                    mlp_only_layers=[], norm_topk_prob=True)
        return text
    if "vision" not in key:
        return {"architectures": ["Qwen3ForCausalLM"], **text}
    text["rope_scaling"] = {"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": True}
    vision = {"patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2, "in_channels": 3,
              "num_position_embeddings": 2304, **key["vision"]}
    return {"architectures": ["Qwen3VLForConditionalGeneration"], "text_config": text, "vision_config": vision,
            "tie_word_embeddings": key["tied"]}


def tensor_shapes(key: dict) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """The language model's and the vision tower's tensors, by checkpoint name, from kestrel's shape tables."""
    from kestrel_trio._model import config_from_dict
    from kestrel_trio._model import vl_config_from_dict
    from kestrel_trio._model import expected_shapes
    from kestrel_trio._model import vision_shapes

    raw = config_dict(key)
    if "vision" not in key:
        return expected_shapes(config_from_dict(raw, source="memory_table")), {}
    vl = vl_config_from_dict(raw, source="memory_table")
    return expected_shapes(vl.text), vision_shapes(vl.vision)


def use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4_k_m_type(name: str, tied: bool) -> str:
    """llama-quantize's Q4_K_M type of checkpoint matrix ``name`` (see the module docstring)."""
    if name == "lm_head.weight" or (tied and name == "model.embed_tokens.weight"):
        return "Q6_K"
    if ".layers." in name:
        layer = int(name.split(".layers.")[1].split(".")[0])
        return "Q6_K" if name.endswith(("v_proj.weight", "down_proj.weight")) and use_more_bits(layer, LAYERS[0]) \
            else "Q4_K"
    return "Q4_K"


LAYERS = [0]  # the model's layer count, for q4_k_m_type's use_more_bits
BYTES_PER_WEIGHT = {"Q8_0": 34 / 32, "Q4_K": 144 / 256, "Q6_K": 210 / 256, "bf16": 2.0, "fp32": 4.0}


def matrix_bytes(form: str, name: str, shape: tuple[int, ...], tied: bool) -> float:
    count = math.prod(shape)
    if form == "int8":
        return count + 4 * count // shape[-1]
    if form == "int4":
        return count / 2 + 2 * count / 64
    if form == "Q4_K_M":
        return count * BYTES_PER_WEIGHT[q4_k_m_type(name, tied)]
    return count * BYTES_PER_WEIGHT[form]


def weight_bytes(key: dict, form: str) -> tuple[float, float]:
    """(language model bytes, vision tower bytes) of ``key``'s model held as ``form``."""
    text, vision = tensor_shapes(key)
    LAYERS[0] = key["layers"]
    total = 0.0
    for name, shape in text.items():
        router = name.endswith("mlp.gate.weight")
        if len(shape) < 2 or (router and form in ("Q8_0", "Q4_K_M")):  # vectors, and GGUF's F32 routers
            total += 4 * math.prod(shape)
        else:
            total += matrix_bytes(form, name, shape, key["tied"])
    matrix_width = 4 if form == "fp32" else 2  # the tower is fp32 in fp32 mode, 16-bit otherwise
    tower = sum(4 * math.prod(s) if len(s) < 2 or name.endswith("pos_embed.weight") else matrix_width * math.prod(s)
                for name, s in vision.items())
    return total, tower


def kv_bytes_per_1000(key: dict) -> int:
    return key["layers"] * key["kv"] * key["head_dim"] * 2 * 4 * 1000


def parameters(key: dict) -> int:
    text, vision = tensor_shapes(key)
    return sum(math.prod(s) for s in (*text.values(), *vision.values()))


def fits(weights: float, key: dict, context: int) -> str:
    need = weights + kv_bytes_per_1000(key) * context / 1000 + RUNTIME_GIB * GIB
    return " / ".join("yes" if need <= (board - OS_GIB) * GIB else "no" for board in BOARDS_GIB)


def table(context: int) -> list[str]:
    lines = ["| model | params | KV per 1,000 tokens | " + " | ".join(FORMS) + " |",
             "|---|---:|---:|" + "---:|" * len(FORMS)]
    for model, key in TEXT.items():
        cells = []
        for form in FORMS:
            text, tower = weight_bytes(key, form)
            cells.append(f"{(text + tower) / GIB:.2f} GiB ({fits(text + tower, key, context)})")
        lines.append(f"| {model} | {parameters(key) / 1e9:.2f} B | {kv_bytes_per_1000(key) / 2**20:.0f} MiB | "
                     + " | ".join(cells) + " |")
    return lines


MMPROJ_FORMS = ("F16", "Q8_0")
VL_GGUF_FORMS = ("Q8_0", "Q4_K_M")


def mmproj_bytes(key: dict, form: str) -> float:
    """Bytes of ``key``'s vision tower from an mmproj file of ``form``, as ``--weights gguf`` holds it."""
    _, vision = tensor_shapes(key)
    per_weight = {"F16": 2.0, "Q8_0": 34 / 32}[form]
    total = 0.0
    for name, shape in vision.items():
        if len(shape) < 2 or name.endswith(("pos_embed.weight", "patch_embed.proj.weight")):
            total += 4 * math.prod(shape)  # float32: vectors, the position table, the joined patch kernel
        else:
            total += per_weight * math.prod(shape)
    return total


def vl_gguf_table(context: int) -> list[str]:
    """Qwen3-VL as a language-model GGUF plus its mmproj GGUF: bytes resident and which boards fit."""
    lines = ["| model | language model | mmproj | language model bytes | mmproj bytes | total (8 / 16 / 32 GB) |",
             "|---|---|---|---:|---:|---:|"]
    for model, key in TEXT.items():
        if "vision" not in key:
            continue
        for form in VL_GGUF_FORMS:
            text, _ = weight_bytes(key, form)
            for tower_form in MMPROJ_FORMS:
                tower = mmproj_bytes(key, tower_form)
                lines.append(f"| {model} | {form} | {tower_form} | {text / GIB:.2f} GiB | {tower / GIB:.2f} GiB | "
                             f"{(text + tower) / GIB:.2f} GiB ({fits(text + tower, key, context)}) |")
    return lines


VIDEO_FRAMES = (8, 16, 32, 64)
# Qwen3-VL's published pixel bounds (its preprocessor_config.json), which kestrel applies to a GGUF pair's
# images and videos (the mmproj file holds none; _model/vision/qwen3_vl_gguf.py's QWEN3_VL_MIN/MAX_PIXELS).
VL_MIN_PIXELS, VL_MAX_PIXELS = 65536, 16777216
VIDEO_SIZES = ((640, 360), (1280, 720))
TIMESTAMP_TOKENS = 7  # "<12.5 seconds>" as Qwen's tokenizer splits it: <, 1, 2, ., 5, " seconds", >


def video_cost(key: dict, frames: int, width: int, height: int) -> tuple[int, int, int, int]:
    """(prompt tokens, vision patches, KV bytes, vision-activation bytes) of ``frames`` sampled frames.

    Frames are sized as kestrel sizes them for a GGUF pair (the mmproj's pixel bounds, Qwen3-VL's published
    image ones, over all frames: kestrel_trio.text.media.videos.video_smart_resize). Tokens: per temporal patch (2
    frames) its h*w/4 pads, <|vision_start|>, <|vision_end|> and its timestamp text. KV: those tokens at
    layers x kv_heads x head_dim x 2 x 4 bytes. Vision activations, the peak while one block runs over all
    patches N (float32): the residual, qkv, rotated q and k, the attention output and the residual sum
    (8 x hidden per patch), the MLP's two intermediate arrays (2 x intermediate per patch), and one temporal
    patch's attention scores (heads x L x L, L its patches).
    """
    from kestrel_trio.text.media.videos import video_smart_resize

    h, w = video_smart_resize(frames, height, width, temporal_factor=2, factor=32, min_pixels=VL_MIN_PIXELS,
                              max_pixels=VL_MAX_PIXELS, param="video")
    temporal, per_frame = -(-frames // 2), (h // 16) * (w // 16)
    tokens = temporal * (per_frame // 4 + 2 + TIMESTAMP_TOKENS)
    patches = temporal * per_frame
    vision = key["vision"]
    activations = 4 * patches * (8 * vision["hidden_size"] + 2 * vision["intermediate_size"])
    activations += 4 * vision["num_heads"] * per_frame**2
    kv = tokens * key["layers"] * key["kv"] * key["head_dim"] * 2 * 4
    return tokens, patches, kv, activations


def video_table() -> list[str]:
    """What one video adds: its prompt tokens, their float32 KV, and the vision tower's peak activations."""
    lines = ["| model | video | frames | prompt tokens | KV (float32) | vision activations (peak) |",
             "|---|---|---:|---:|---:|---:|"]
    for model, key in TEXT.items():
        if "vision" not in key:
            continue
        for width, height in VIDEO_SIZES:
            for frames in VIDEO_FRAMES:
                tokens, _, kv, act = video_cost(key, frames, width, height)
                lines.append(f"| {model} | {width}x{height} | {frames} | {tokens:,} | {kv / GIB:.2f} GiB | "
                             f"{act / GIB:.2f} GiB |")
    return lines


def q4_k_m_mix(model: str) -> str:
    """How many of ``model``'s matrix weights Q4_K_M puts in Q6_K."""
    key = TEXT[model]
    text, _ = tensor_shapes(key)
    LAYERS[0] = key["layers"]
    six = sum(math.prod(s) for n, s in text.items() if len(s) >= 2 and not n.endswith("mlp.gate.weight")
              and q4_k_m_type(n, key["tied"]) == "Q6_K")
    every = sum(math.prod(s) for n, s in text.items() if len(s) >= 2 and not n.endswith("mlp.gate.weight"))
    return f"{model}: {six / every:.1%} of matrix weights in Q6_K"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=4096, help="tokens of KV counted for 'fits' (default 4096)")
    args = parser.parse_args()
    print(f"weights resident per form; 'fits' = weights + {args.context} tokens of float32 KV + {RUNTIME_GIB:g} GiB "
          f"runtime <= board - {OS_GIB:g} GiB for the OS\n")
    print("\n".join(table(args.context)))
    print("\nQwen3-VL from a language-model GGUF and its mmproj GGUF (--mmproj, --weights gguf):\n")
    print("\n".join(vl_gguf_table(args.context)))
    print("\nOne video on Qwen3-VL (GGUF pair sizing; frames = sampled frames):\n")
    print("\n".join(video_table()))
    print("\nQ4_K_M mix: " + "; ".join(q4_k_m_mix(m) for m in TEXT))


if __name__ == "__main__":
    main()
