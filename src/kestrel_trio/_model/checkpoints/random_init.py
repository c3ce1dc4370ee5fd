"""Seeded random weights for any supported config: tests, benchmarks and the demo model.

Norm weights are drawn near 1 and everything else from N(0, std), so a random
model's logits are decisive enough to make greedy decoding meaningful.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from kestrel_trio._model.checkpoints.config import ModelConfig, config_from_dict
from kestrel_trio._model.checkpoints.safetensors import save_safetensors
from kestrel_trio._model.checkpoints.shapes import expected_shapes

__all__ = ["random_tensors", "write_random_checkpoint"]


def random_tensors(config: ModelConfig, seed: int, std: float = 0.2) -> dict[str, np.ndarray]:
    """Every tensor ``config`` implies (per-expert MoE layout), float32, drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for name, shape in expected_shapes(config).items():
        values = rng.standard_normal(shape, dtype=np.float32)  # shape as named
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            values = np.float32(1.0) + np.float32(0.1) * values
        else:
            values *= np.float32(std)
        tensors[name] = values
    return tensors


def write_random_checkpoint(
    folder: Path,
    config: dict[str, Any],
    *,
    seed: int = 0,
    dtype: str = "F32",
    std: float = 0.2,
    shards: int = 1,
) -> dict[str, np.ndarray]:
    """Write config.json and seeded random safetensors weights into ``folder``.

    Args:
        folder: created if missing.
        config: the config.json contents.
        seed: the random seed.
        dtype: storage dtype, "F32", "F16" or "BF16".
        std: standard deviation of non-norm weights.
        shards: number of files; more than one also writes model.safetensors.index.json.

    Returns:
        The tensors as written, in float32 (before any rounding to the storage dtype).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    tensors = random_tensors(config_from_dict(config), seed, std)
    if shards <= 1:
        save_safetensors(folder / "model.safetensors", tensors, dtype)
        return tensors
    names = list(tensors)
    weight_map: dict[str, str] = {}
    for index, part in enumerate(np.array_split(np.arange(len(names)), shards)):
        file = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        save_safetensors(folder / file, {names[i]: tensors[names[i]] for i in part}, dtype)
        weight_map.update({names[i]: file for i in part})
    index_doc = {"metadata": {}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index_doc, indent=2), encoding="utf-8")
    return tensors
