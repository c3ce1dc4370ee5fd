"""The checkpoints several benchmarks build: Qwen3-0.6B's exact shapes, random weights, as safetensors or GGUF.

Built once into a cache folder outside the repository (each file written beside its target and renamed when
complete, so an interrupted build is never reused). weights/bench_load.py measures the safetensors checkpoint;
weights/bench_quant.py, llama_cpp/bench_http.py and llama_cpp/board_speed.py write GGUFs with these writers.
"""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path

QWEN3_0_6B = {
    "architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "hidden_size": 1024, "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "rope_theta": 1000000,
    "rope_scaling": None, "torch_dtype": "bfloat16", "attention_bias": False, "hidden_act": "silu",
}


def build(folder: Path, dtype: str) -> int:
    """Write the checkpoint unless it is there; return its parameter count."""
    from kestrel_trio._model import config_from_dict, expected_shapes, write_random_checkpoint

    shapes = expected_shapes(config_from_dict(QWEN3_0_6B))
    params = sum(math.prod(shape) for shape in shapes.values())
    if not (folder / "config.json").exists():
        started = time.perf_counter()
        # Build beside the target and rename when complete, so an interrupted build is never reused.
        partial = folder.with_name(folder.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        write_random_checkpoint(partial, QWEN3_0_6B, seed=0, dtype=dtype, std=0.02)
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)
        print(f"built {folder} in {time.perf_counter() - started:.1f} s", flush=True)
    return params


K_QUANT_SIZES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}


def random_k_blocks(rng, kind: str, rows: int, cols: int, *lead: int):
    """Random valid K-quant blocks for [*lead, rows, cols] weights of about 0.02, uint8 [*lead, rows, row_bytes].

    As tests/fixtures/make_gguf_fixtures.py does: random quants and 6/8-bit
    scales, fp16 super-block scales drawn so the weights come out near the
    size of trained ones (finite, roughly centred).
    """
    import numpy as np

    size = K_QUANT_SIZES[kind]
    n = math.prod(lead) * rows * cols // 256
    raw = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    jitter = rng.uniform(0.5, 1.5, size=(n, 1))
    if kind == "Q6_K":
        raw[:, 208:210] = (jitter * 0.02 / (74 * 18.5)).astype(np.float16).view(np.uint8)
    else:
        q_mid = 7.5 if kind == "Q4_K" else 15.5
        d = jitter * 0.02 / (36 * q_mid * 1.2)
        raw[:, 0:2] = d.astype(np.float16).view(np.uint8)
        raw[:, 2:4] = (d * q_mid).astype(np.float16).view(np.uint8)
    return raw.reshape(*lead, rows, cols // 256 * size)


def write_gguf(writer, path: Path) -> None:
    """Write ``writer``'s file beside ``path`` and rename it there when complete (a torn write is never reused)."""
    partial = path.with_name(path.name + ".partial")
    writer.write_header_to_file(partial)
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.rename(path)


def qwen3_writer(arch: str, name: str, *, layers: int, context: int, hidden: int, inter: int, heads: int,
                 kv_heads: int, head_dim: int, vocab: int, rope_theta: float = 1e6, eps: float = 1e-6):
    """A GGUFWriter for ``arch`` ("qwen3", "qwen3moe") with a Qwen3's shape metadata written."""
    import gguf

    writer = gguf.GGUFWriter(None, arch)
    writer.add_name(name)
    writer.add_block_count(layers)
    writer.add_context_length(context)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(inter)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(float(rope_theta))
    writer.add_layer_norm_rms_eps(eps)
    writer.add_vocab_size(vocab)
    return writer


def build_dense_gguf(path: Path, kind: str, source: Path, add_vocab=None) -> None:
    """Qwen3-0.6B's tensors from the bf16 checkpoint ``source`` as a ``kind`` GGUF (vectors F32).

    ``kind`` is F32, Q8_0 or a K-quant; ``add_vocab(writer)``, when given, writes the tokenizer's metadata.
    """
    if path.exists():
        return
    import gguf
    import numpy as np

    from kestrel_trio._model import gguf_name
    from kestrel_trio._model import SafetensorsCheckpoint

    started = time.perf_counter()
    c = QWEN3_0_6B
    writer = qwen3_writer("qwen3", f"qwen3-0.6b-shapes-{kind}", layers=c["num_hidden_layers"],
                          context=c["max_position_embeddings"], hidden=c["hidden_size"], inter=c["intermediate_size"],
                          heads=c["num_attention_heads"], kv_heads=c["num_key_value_heads"], head_dim=c["head_dim"],
                          vocab=c["vocab_size"], rope_theta=c["rope_theta"], eps=c["rms_norm_eps"])
    if add_vocab is not None:
        add_vocab(writer)
    checkpoint = SafetensorsCheckpoint(source)
    rng = np.random.default_rng(17)
    for name in sorted(checkpoint.tensors, key=lambda n: (n.count("."), n)):
        data = checkpoint.read(name)  # float32, its shape
        target = gguf_name(name)
        if data.ndim == 1 or kind == "F32":
            writer.add_tensor(target, np.ascontiguousarray(data, dtype=np.float32))
        elif kind == "Q8_0":
            writer.add_tensor(target, gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0),
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(target, random_k_blocks(rng, kind, *data.shape),
                              raw_dtype=gguf.GGMLQuantizationType[kind])
    path.parent.mkdir(parents=True, exist_ok=True)
    write_gguf(writer, path)
    print(f"built {path} ({path.stat().st_size / 2**30:.2f} GiB) in {time.perf_counter() - started:.0f} s", flush=True)
