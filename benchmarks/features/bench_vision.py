"""Vision encoding time of Qwen3-VL-2B's vision tower: kestrel-trio (numpy) vs transformers (torch).

Usage (reference venv: torch + transformers + Pillow; threadpoolctl optional):
    python benchmarks/features/bench_vision.py [--size 448] [--threads N] [--runs 1] [--cache DIR]

Builds once, in a cache folder outside the repository, a random-weight
Qwen3VLForConditionalGeneration whose ``vision_config`` has Qwen3-VL-2B's exact
shapes (24 blocks, width 1024, 16 heads, deepstack after blocks 5, 11, 17,
output width 2048). Only the vision tower is measured, so the language model
is a one-layer stand-in with the real hidden size (2048) and a small
vocabulary. One ``--size`` x ``--size`` RGB image is preprocessed once by
kestrel_trio.text.media.images (Qwen3-VL's processor settings), then the same
pixel_values are encoded by both implementations with the same thread count.
Prints both times, the ratio, the largest output difference and the BLAS.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import time
from pathlib import Path

import numpy as np

VISION_2B = {
    "depth": 24, "hidden_size": 1024, "intermediate_size": 4096, "num_heads": 16, "in_channels": 3,
    "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2, "out_hidden_size": 2048,
    "num_position_embeddings": 2304, "deepstack_visual_indexes": [5, 11, 17], "hidden_act": "gelu_pytorch_tanh",
}
TEXT_STAND_IN = {
    "vocab_size": 1024, "hidden_size": 2048, "intermediate_size": 256, "num_hidden_layers": 1,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 4096,
    "rope_parameters": {"rope_type": "default", "rope_theta": 5_000_000.0, "mrope_section": [24, 20, 20],
                        "mrope_interleaved": True},
}
PREPROCESSOR_2B = {  # Qwen3-VL's preprocessor_config.json
    "size": {"shortest_edge": 65536, "longest_edge": 16777216}, "patch_size": 16, "temporal_patch_size": 2,
    "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
}


def build(folder: Path) -> None:
    """Write the random checkpoint (bf16, as published) unless it is already there."""
    if (folder / "config.json").exists():
        return
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    started = time.perf_counter()
    config = Qwen3VLConfig(text_config=TEXT_STAND_IN, vision_config=VISION_2B, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen3VLForConditionalGeneration(config).to(torch.bfloat16)
    partial = folder.with_name(folder.name + ".partial")  # renamed when complete: never reuse a half build
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    print(f"built {folder} in {time.perf_counter() - started:.1f} s", flush=True)


def blas_info() -> str:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl not installed"
    pools = [f"{p['internal_api']} {p.get('version')} ({p.get('prefix')}), {p['num_threads']} threads"
             for p in threadpool_info()]
    return "; ".join(pools) or "none found"


def pixel_inputs(size: int) -> tuple[np.ndarray, np.ndarray]:
    import PIL.Image

    from kestrel_trio.text.media.images import ImageProcessorConfig, preprocess_image

    rgb = np.random.default_rng(0).integers(0, 256, size=(size, size, 3), dtype=np.uint8)
    out = io.BytesIO()
    PIL.Image.fromarray(rgb).save(out, format="PNG")
    image = preprocess_image(out.getvalue(), ImageProcessorConfig.from_dict(PREPROCESSOR_2B),
                             max_bytes=1 << 26, max_pixels=1 << 26)
    return image.pixel_values, np.array([image.grid_thw], dtype=np.int64)


def time_kestrel(folder: Path, pixels: np.ndarray, grid: np.ndarray, runs: int) -> tuple[float, np.ndarray]:
    from kestrel_trio._model import load_qwen3_vl

    model = load_qwen3_vl(folder)
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        features = model.encode_images(pixels, grid)
        best = min(best, time.perf_counter() - started)
    return best, features.embeds


def time_torch(folder: Path, pixels: np.ndarray, grid: np.ndarray, runs: int) -> tuple[float, np.ndarray]:
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    model = Qwen3VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    visual = model.model.visual.eval()
    pixel_t, grid_t = torch.from_numpy(pixels), torch.from_numpy(grid)
    best = float("inf")
    with torch.no_grad():
        for _ in range(runs):
            started = time.perf_counter()
            out = visual(pixel_t, grid_thw=grid_t)
            best = min(best, time.perf_counter() - started)
    return best, out.pooler_output.numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=448, help="image side (pixels)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="BLAS and torch threads")
    parser.add_argument("--runs", type=int, default=1, help="timed runs each (best kept)")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "kestrel-trio-bench")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(args.threads)
    except ImportError:
        pass
    folder = args.cache / "qwen3-vl-2b-vision-shapes-bf16"
    build(folder)
    pixels, grid = pixel_inputs(args.size)
    print(f"machine: {os.cpu_count()} cpus, load average {os.getloadavg()[0]:.2f}; {args.threads} threads")
    print(f"image {args.size}x{args.size}: grid {grid[0].tolist()}, {pixels.shape[0]} patches, "
          f"{pixels.shape[0] // 4} tokens")
    kestrel_s, kestrel_out = time_kestrel(folder, pixels, grid, args.runs)
    torch_s, torch_out = time_torch(folder, pixels, grid, args.runs)
    diff = float(np.abs(kestrel_out - torch_out).max() / np.abs(torch_out).max())
    print(f"BLAS (numpy): {blas_info()}")
    print(f"torch {torch.__version__}: {torch.get_num_threads()} threads")
    print(f"kestrel-trio (numpy): {kestrel_s:.3f} s")
    print(f"transformers (torch): {torch_s:.3f} s")
    print(f"ratio kestrel/torch: {kestrel_s / torch_s:.2f}x; max |diff| / max |out| = {diff:.2e}")


if __name__ == "__main__":
    main()
