"""A Qwen3-MoE checkpoint in the fused expert layout (transformers 5's in-memory names) loads to the same model.

The fixture is stored per expert, as the published checkpoints are; this test
restacks it as ``mlp.experts.gate_up_proj`` [E, 2*inter, hidden] (gate rows
first, as transformers' ``chunk(2)`` reads them) and ``mlp.experts.down_proj``
[E, hidden, inter], then compares the two loads.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np

from kestrel_trio import load_model
from kestrel_trio._model.checkpoints.safetensors import SafetensorsCheckpoint, save_safetensors

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_moe"
_EXPERT = re.compile(r"(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")


def fused_copy(folder: Path) -> None:
    checkpoint = SafetensorsCheckpoint(FIXTURE)
    config = json.loads((FIXTURE / "config.json").read_text())
    experts: dict[str, dict[str, list]] = {}
    tensors = {}
    for name in checkpoint.tensors:
        match = _EXPERT.fullmatch(name)
        if match is None:
            tensors[name] = checkpoint.read(name)
            continue
        prefix, index, kind = match.groups()
        experts.setdefault(prefix, {}).setdefault(kind, [None] * config["num_experts"])[int(index)] = \
            checkpoint.read(name)
    for prefix, kinds in experts.items():
        gate_up = [np.concatenate([g, u]) for g, u in zip(kinds["gate_proj"], kinds["up_proj"])]
        tensors[prefix + ".gate_up_proj"] = np.stack(gate_up)  # [E, 2*inter, hidden]
        tensors[prefix + ".down_proj"] = np.stack(kinds["down_proj"])  # [E, hidden, inter]
    folder.mkdir()
    shutil.copy(FIXTURE / "config.json", folder / "config.json")
    save_safetensors(folder / "model.safetensors", tensors)


def test_the_fused_expert_layout_gives_the_same_logits_as_per_expert(tmp_path) -> None:
    fused_copy(tmp_path / "fused")
    ids = list(range(3, 40))
    per_expert = load_model(FIXTURE).logits(ids)  # [T, vocab]
    fused = load_model(tmp_path / "fused").logits(ids)  # [T, vocab]
    assert per_expert.shape == fused.shape == (len(ids), 512)
    np.testing.assert_allclose(fused, per_expert, rtol=0, atol=1e-6)
