"""bench_model.py's PyTorch side (transformers, eager, fp32), run in a fresh subprocess, and the checkpoint it
writes for both sides: Qwen3-0.6B's exact shapes, seeded random weights.

Times are seconds from ``time.perf_counter``, rates tokens per second, memory bytes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

from _bench_common import best_of, status_bytes
from _bench_model_plan import BATCHES, PREFILL_LENGTHS, SHORT_PROMPT, median, prompt
from _checkpoints import QWEN3_0_6B


def build_checkpoint(folder: Path, dtype: str) -> None:
    """Write the checkpoint with transformers (seeded random init) unless it is already there."""
    if (folder / "config.json").exists():
        return
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    started = time.perf_counter()
    fields = {k: v for k, v in QWEN3_0_6B.items() if k not in ("architectures", "torch_dtype")}
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**fields)).eval()
    partial = folder.with_name(folder.name + ".partial")  # renamed when complete: a torn build is never reused
    shutil.rmtree(partial, ignore_errors=True)
    model.to(dtype=getattr(torch, dtype)).save_pretrained(partial)
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    print(f"built {folder} with transformers in {time.perf_counter() - started:.1f} s", flush=True)


def torch_side(folder: Path, args: argparse.Namespace) -> dict:
    started = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        model(torch.tensor([[1, 2, 3]]))
    result = {
        "ready_s": time.perf_counter() - started, "rss_after_load": status_bytes("VmRSS"),
        "blas": f"torch {torch.__version__} ({'MKL' if torch.backends.mkl.is_available() else 'no MKL'}), "
        f"threads={torch.get_num_threads()}, attention={model.config._attn_implementation}, "
        f"ATen kernels {torch.backends.cpu.get_cpu_capability()}, "
        f"MKL_ENABLE_INSTRUCTIONS={os.environ.get('MKL_ENABLE_INSTRUCTIONS', 'unset')}",
    }
    with torch.inference_mode():
        for length in PREFILL_LENGTHS[: 1 if args.quick else 2]:
            ids = torch.tensor([prompt(length, length)])
            result[f"prefill_{length}"] = length / best_of(3, lambda: model(ids, use_cache=True, logits_to_keep=1))
        result.update(torch_prefill_products(model, torch, PREFILL_LENGTHS[: 1 if args.quick else 2]))
        torch.set_float32_matmul_precision("medium")  # PyTorch's own bf16 products for float32 weights (oneDNN)
        for length in PREFILL_LENGTHS[: 1 if args.quick else 2]:
            ids = torch.tensor([prompt(length, length)])
            result[f"prefill_bf16_{length}"] = length / best_of(
                3, lambda: model(ids, use_cache=True, logits_to_keep=1))
        torch.set_float32_matmul_precision("highest")
        result["decode_1"] = torch_decode(model, torch, 1, 16 if args.quick else 128)
        for batch in BATCHES:
            result[f"bare_{batch}"] = torch_decode(model, torch, batch, 8 if args.quick else args.batch_tokens)
    result["peak_rss"] = status_bytes("VmHWM")
    return result


def torch_prefill_products(model, torch, lengths) -> dict:
    """Seconds of PyTorch's layer products (its own, unfused linears; every layer on every row), n rows at once."""
    names = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
             "mlp.up_proj", "mlp.down_proj")
    matrices = [layer.get_submodule(name).weight for layer in model.model.layers for name in names]
    result = {}
    for n in lengths:
        xs = {w.shape[1]: torch.randn(n, w.shape[1]) for w in matrices}  # [n, in]
        result[f"products_{n}_s"] = best_of(
            3, lambda: [torch.nn.functional.linear(xs[w.shape[1]], w) for w in matrices])
    return result


def torch_decode(model, torch, batch: int, steps: int) -> float:
    """Aggregate greedy decode tok/s of a batch of equal-length prompts, through the model's KV cache."""
    ids = torch.tensor([prompt(SHORT_PROMPT, i) for i in range(batch)])  # [B, T]
    out = model(ids, use_cache=True, logits_to_keep=1)
    cache, tokens = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)  # [B, 1]
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        out = model(tokens, past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache, tokens = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)  # [B, 1]
        times.append(time.perf_counter() - started)
    return batch / median(times)
