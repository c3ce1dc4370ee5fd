"""A model of the board's decode speed, since no board is here: instructions counted under qemu, bytes computed.

Usage (as root on an x86-64 Debian machine; see docs/arm-emulation.md for building the pieces):
    python benchmarks/llama_cpp/board_speed.py --root ARM64_ROOT --qemu QEMU_AARCH64 --plugin LIBINSN_SO \\
        --llama-bench LLAMA_BENCH [--cpu cortex-a76] [--models 1.7b,4b] [--forms Q8_0,Q4_K_M] [--cache DIR]
    python benchmarks/llama_cpp/board_speed.py ... --smollm2 Q8_0,Q4_0,Q4_1 --llama-quantize LLAMA_QUANTIZE \\
        --llama-build LLAMA_CPP/build-a76 [--bound 1.5] [--n1 8 --n2 40]

With ``--smollm2`` it counts SmolLM2-135M-Instruct's decode steps instead (the shipped Q4_1 file, Q8_0 and Q4_0
made from it by llama.cpp's llama-quantize), kestrel-trio's (``--products``) against llama.cpp's, and prints each
ratio against ``--bound``: the integer-products issue's method. Both continue "The capital of France is" greedily
(kestrel-trio: ``greedy`` on the ids its tokenizer gives; llama.cpp: its ``llama-simple`` example, which this
script copies, sets to one thread and keeps from stopping at end of generation, and links against
``--llama-build``'s static libraries with ``aarch64-linux-gnu-g++``); per token = (count at 40 new tokens -
count at 8) / 32. (``llama-bench -p 0`` counts more per token on the same file: 49.3 M against 35.0 M on Q8_0.)

For one decode step of Qwen3-1.7B's and Qwen3-4B's shapes (random weights) at Q8_0 and Q4_K_M, it counts
the aarch64 instructions kestrel-trio executes (its kernels compiled by numba for ``--cpu``) and those
llama.cpp's own aarch64 build executes (``llama-bench``, cross-compiled; one thread each), under qemu-user's
``insn`` plugin; computes the weight bytes a step reads; and estimates tok/s on an RK3588's four Cortex-A76
cores at 2.4 GHz with 15 GB/s of memory bandwidth (``--cores``, ``--ghz``, ``--ipc``, ``--gbps``).

Method:
* Counting a whole 4B model under emulation would take hours, so each shape is built truncated: its full
  vocabulary (the tied embedding, which is the output matrix too) and one or two decoder layers of its exact
  shapes. A decoder layer's count is the count of a two-layer file less the one-layer file's; the rest of a
  step (embedding, last norm, output matrix, per-step overhead) is the one-layer count less a layer. The full
  model is then rest + layers, each layer of its kind: Q4_K_M (llama.cpp's recipe) stores attn_v and ffn_down
  as Q6_K in the layers its ``use_more_bits`` names (about half) and Q4_K elsewhere, the tied embedding Q6_K;
  Q8_0 stores everything Q8_0. Both programs run the same files.
* Per token: (count after N2 tokens - count after N1 tokens) / (N2 - N1), with the prompt (8 tokens) and
  start-up in both counts and so cancelled; the tokens sit at positions 8-14, where attention is a small part.
* kestrel-trio: ``load_model(FILE, blas_threads=1).greedy(prompt, N)`` in the arm64 root's Python, with a warm
  numba cache compiled for ``--cpu`` (a run before the counted ones fills it). llama.cpp: ``llama-bench -p 0
  -n N -t 1 -r 1 --no-warmup``.
* The estimate: a step takes the longer of its compute (instructions / (cores x GHz x IPC)) and its memory
  traffic (weight bytes / bandwidth). IPC 2 is an assumption (a Cortex-A76 retires up to 4 a cycle; SIMD-bound
  loops reach 2-3); the four cores are taken as scaling perfectly, which flatters kestrel-trio more than
  llama.cpp: part of its instructions are Python's, on one thread. It is an estimate, not a measurement.

Everything built goes to ``--cache`` (default ~/.cache/kestrel-trio-bench/board), outside the repository.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules
from _checkpoints import qwen3_writer, random_k_blocks, write_gguf  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CACHE = Path.home() / ".cache" / "kestrel-trio-bench" / "board"
SHAPES = {
    "1.7b": {"hidden": 2048, "inter": 6144, "heads": 16, "kv_heads": 8, "head_dim": 128, "layers": 28},
    "4b": {"hidden": 2560, "inter": 9728, "heads": 32, "kv_heads": 8, "head_dim": 128, "layers": 36},
}
VOCAB = 151936
PROMPT = [785, 6722, 315, 9625, 374, 12095, 13, 576]  # 8 token ids, any will do
SMOL_PROMPT = "The capital of France is"  # the integer-products issue's SmolLM2 count
BYTES_PER_BLOCK = {"Q8_0": (34, 32), "Q4_K": (144, 256), "Q6_K": (210, 256)}


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's choice (llama-quant.cpp) of the Q4_K_M layers whose attn_v and ffn_down get Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def layer_forms(form: str, more_bits: bool) -> dict[str, str]:
    """The storage form of each of a layer's matrices."""
    if form == "Q8_0":
        return dict.fromkeys(("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"), "Q8_0")
    six = "Q6_K" if more_bits else "Q4_K"
    return {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": six, "attn_output": "Q4_K", "ffn_gate": "Q4_K",
            "ffn_up": "Q4_K", "ffn_down": six}


def layer_shapes(s: dict) -> dict[str, tuple[int, int]]:
    """[rows, cols] of a layer's matrices."""
    q, kv = s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    return {"attn_q": (q, s["hidden"]), "attn_k": (kv, s["hidden"]), "attn_v": (kv, s["hidden"]),
            "attn_output": (s["hidden"], q), "ffn_gate": (s["inter"], s["hidden"]),
            "ffn_up": (s["inter"], s["hidden"]), "ffn_down": (s["hidden"], s["inter"])}


def embedding_form(form: str) -> str:
    return "Q8_0" if form == "Q8_0" else "Q6_K"  # llama.cpp gives the output matrix Q6_K in Q4_K_M


def matrix_bytes(form: str, rows: int, cols: int) -> int:
    size, per = BYTES_PER_BLOCK[form]
    return rows * cols // per * size


def step_bytes(model: str, form: str) -> int:
    """Weight bytes a decode step of the whole model reads (every matrix once, the output matrix included)."""
    s = SHAPES[model]
    total = matrix_bytes(embedding_form(form), VOCAB, s["hidden"])
    for i in range(s["layers"]):
        forms = layer_forms(form, use_more_bits(i, s["layers"]))
        total += sum(matrix_bytes(forms[name], *shape) for name, shape in layer_shapes(s).items())
    return total


def random_q8_0(rng, rows: int, cols: int):
    """Random valid Q8_0 blocks for weights of about 0.02: uint8 [rows, cols / 32 * 34]."""
    import numpy as np

    raw = rng.integers(0, 256, size=(rows * cols // 32, 34), dtype=np.uint8)
    raw[:, 0:2] = (rng.uniform(0.5, 1.5, size=(raw.shape[0], 1)) * 0.02 / 64).astype(np.float16).view(np.uint8)
    return raw.reshape(rows, cols // 32 * 34)


def build_file(path: Path, model: str, form: str, layers: list[bool], add_vocab) -> None:
    """A truncated model: ``model``'s shapes and vocabulary, one decoder layer per entry of ``layers`` (True: a
    Q4_K_M "more bits" layer)."""
    if path.exists():
        return
    import gguf
    import numpy as np

    started = time.perf_counter()
    s = SHAPES[model]
    writer = qwen3_writer("qwen3", path.stem, layers=len(layers), context=40960, hidden=s["hidden"], inter=s["inter"],
                          heads=s["heads"], kv_heads=s["kv_heads"], head_dim=s["head_dim"], vocab=VOCAB)
    add_vocab(writer)
    rng = np.random.default_rng(47)

    def matrix(name: str, kind: str, rows: int, cols: int) -> None:
        data = random_q8_0(rng, rows, cols) if kind == "Q8_0" else random_k_blocks(rng, kind, rows, cols)
        writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[kind])

    def vector(name: str, size: int) -> None:
        writer.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(size)).astype(np.float32))

    matrix("token_embd.weight", embedding_form(form), VOCAB, s["hidden"])
    vector("output_norm.weight", s["hidden"])
    for i, more in enumerate(layers):
        forms = layer_forms(form, more)
        for name, (rows, cols) in layer_shapes(s).items():
            matrix(f"blk.{i}.{name}.weight", forms[name], rows, cols)
        for name, size in (("attn_norm", s["hidden"]), ("ffn_norm", s["hidden"]), ("attn_q_norm", s["head_dim"]),
                           ("attn_k_norm", s["head_dim"])):
            vector(f"blk.{i}.{name}.weight", size)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_gguf(writer, path)
    print(f"built {path.name} ({path.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - started:.0f} s",
          flush=True)


def counted(command: list[str], qemu: str, plugin: str, cpu: str, env: dict, root: str | None) -> int:
    """Guest instructions ``command`` executes under qemu-user's insn plugin."""
    prefix = [qemu, "-cpu", cpu, "-plugin", f"{plugin},inline=on", "-d", "plugin"] + (["-L", root] if root else [])
    done = subprocess.run(prefix + command, capture_output=True, text=True, env=env, timeout=4 * 3600)
    found = re.findall(r"insns: (\d+)", done.stderr)
    if done.returncode != 0 or not found:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return int(found[-1])


def kestrel_command(args, path: Path, tokens: int) -> tuple[list[str], dict]:
    prompt = f"m.tokenizer.encode({SMOL_PROMPT!r})" if args.smollm2 else repr(PROMPT)
    code = ("import sys; from kestrel_trio import load_model; "
            f"m = load_model(sys.argv[1], blas_threads=1, products={args.products!r}); "
            f"m.greedy({prompt}, int(sys.argv[2]))")
    site = f"/opt/venv/lib/python{args.python}/site-packages"  # the arm64 root's venv (.ci/arm-lane makes it)
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
           "PYTHONPATH": f"{REPO / 'src'}:{site}", "NUMBA_CPU_NAME": args.cpu,
           "NUMBA_CACHE_DIR": str(args.cache / f"numba-{args.cpu}")}
    return [f"{args.root}/usr/bin/python{args.python}", "-c", code, str(path), str(tokens)], env


def per_token(count, n1: int, n2: int) -> float:
    return (count(n2) - count(n1)) / (n2 - n1)


def program_forms_differ(files: dict[str, Path]) -> bool:
    """Whether the files hold different forms (SmolLM2's Q8_0, Q4_0, Q4_1), each of which compiles its own code."""
    return len({path.name.split("-")[-1] for path in files.values()}) > 1


def measure(args, program: str, files: dict[str, Path]) -> dict[str, float]:
    """Instructions per decoded token of each file for ``program`` ("kestrel" or "llama.cpp")."""
    results = {}
    for n, (key, path) in enumerate(files.items()):
        if program == "kestrel":
            def count(tokens, path=path):
                command, env = kestrel_command(args, path, tokens)
                return counted(command, args.qemu, args.plugin, args.cpu, env, args.root)
            if n == 0 or program_forms_differ(files):
                count(args.n2)  # numba's cache filled with every function the counted runs call (not counted)
        elif args.smollm2:
            def count(tokens, path=path):
                command = [str(args.llama_simple), "-m", str(path), "-n", str(tokens), SMOL_PROMPT]
                return counted(command, args.qemu, args.plugin, args.cpu, {"PATH": "/usr/bin:/bin"}, None)
        else:
            def count(tokens, path=path):
                command = [args.llama_bench, "-m", str(path), "-p", "0", "-n", str(tokens), "-t", "1", "-r", "1",
                           "--no-warmup", "-o", "json"]
                return counted(command, args.qemu, args.plugin, args.cpu, {"PATH": "/usr/bin:/bin"}, None)
        started = time.perf_counter()
        results[key] = per_token(count, args.n1, args.n2)
        print(f"  {program:9} {path.name}: {results[key] / 1e6:9.1f} M instructions a token "
              f"({time.perf_counter() - started:.0f} s)", flush=True)
    return results


def whole_step(counts: dict[str, float], model: str, form: str) -> float:
    """Instructions of a full model's step from the truncated files' counts (see the module's docstring)."""
    plain = counts["plain2"] - counts["plain1"]
    rest = counts["plain1"] - plain
    n = SHAPES[model]["layers"]
    if form == "Q8_0":
        return rest + n * plain
    more = counts["more2"] - counts["plain1"]
    n_more = sum(use_more_bits(i, n) for i in range(n))
    return rest + (n - n_more) * plain + n_more * more


def estimate(instructions: float, weight_bytes: int, args, cores: int) -> float:
    compute = instructions / (cores * args.ghz * 1e9 * args.ipc)
    memory = weight_bytes / (args.gbps * 1e9)
    return 1.0 / max(compute, memory)


def smollm2_files(args, forms: list[str]) -> dict[str, Path]:
    """SmolLM2-135M-Instruct as shipped (Q4_1, the model cache's) and requantized by llama.cpp to the other forms."""
    from kestrel_trio.hub import NAMED_MODELS, fetch_named_model, kestrel_cache_dir

    shipped = fetch_named_model(NAMED_MODELS["smollm2-135m"], kestrel_cache_dir())[0]
    files = {}
    for form in forms:
        files[form] = shipped if form == "Q4_1" else args.cache / f"smollm2-135m-{form}.gguf"
        if not files[form].exists():
            if args.llama_quantize is None:
                raise SystemExit(f"--llama-quantize is needed to make {files[form].name}")
            subprocess.run([args.qemu, "-cpu", args.cpu, args.llama_quantize, "--allow-requantize", str(shipped),
                            str(files[form]), form, "2"], check=True, capture_output=True, timeout=3600)
    return files


def llama_simple_counting(build: Path, out: Path) -> Path:
    """llama.cpp's llama-simple example (from the tree ``build`` was made from) on one thread, not stopping at end
    of generation, linked against ``build``'s static libraries for aarch64: ``out``."""
    tree = build.resolve().parent
    text = (tree / "examples" / "simple" / "simple.cpp").read_text()
    perf, eog = "    ctx_params.no_perf = false;\n", "if (llama_vocab_is_eog(vocab, new_token_id))"
    if text.count(perf) != 1 or text.count(eog) != 1:
        raise SystemExit(f"{tree}'s examples/simple/simple.cpp is not the one this script knows how to change")
    text = text.replace(perf, perf + "    ctx_params.n_threads = 1;\n    ctx_params.n_threads_batch = 1;\n")
    source = out.with_suffix(".cpp")
    source.write_text(text.replace(eog, "if (false)"))
    libraries = [build / "src" / "libllama.a"] + [build / "ggml" / "src" / f"lib{name}.a"
                                                  for name in ("ggml", "ggml-cpu", "ggml-base")]
    subprocess.run(["aarch64-linux-gnu-g++", "-O2", "-std=c++17", "-static", f"-I{tree / 'include'}",
                    f"-I{tree / 'ggml' / 'include'}", str(source), "-o", str(out), *map(str, libraries), "-lpthread"],
                   check=True, capture_output=True, timeout=600)
    return out


def smollm2_counts(args) -> None:
    """Instructions per decoded token of SmolLM2 at each form, kestrel-trio against llama.cpp, and their ratio."""
    forms = args.smollm2.split(",")
    args.cache.mkdir(parents=True, exist_ok=True)
    if args.llama_build is None:
        raise SystemExit("--smollm2 needs --llama-build (llama.cpp's aarch64 build directory)")
    counting = args.cache / f"llama-simple-count-{args.llama_build.name}"
    args.llama_simple = llama_simple_counting(args.llama_build, counting)
    files = smollm2_files(args, forms)
    print(f"qemu CPU {args.cpu}; kestrel-trio from {REPO} (products {args.products}); llama.cpp {args.llama_simple}; "
          f"tokens {args.n1}->{args.n2}", flush=True)
    ours, theirs = measure(args, "kestrel", files), measure(args, "llama.cpp", files)
    print(f"\nSmolLM2-135M-Instruct, one decode step under qemu -cpu {args.cpu}, M instructions a token")
    print("| form | llama.cpp | kestrel-trio | ratio | within " + f"{args.bound}x |")
    print("|---|---|---|---|---|")
    for form in forms:
        ratio = ours[form] / theirs[form]
        print(f"| {form} | {theirs[form] / 1e6:.1f} | {ours[form] / 1e6:.1f} | {ratio:.2f}x | "
              f"{'yes' if ratio <= args.bound else 'no'} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", required=True, help="the arm64 root with /opt/venv (.ci/arm-lane makes it)")
    parser.add_argument("--qemu", required=True, help="a dynamic qemu-aarch64 (Debian's qemu-user package)")
    parser.add_argument("--plugin", required=True, help="libinsn.so built from qemu's tests/plugin/insn.c")
    parser.add_argument("--llama-bench", help="llama.cpp's llama-bench built for aarch64, static (not --smollm2)")
    parser.add_argument("--cpu", default="cortex-a76")
    parser.add_argument("--python", default="3.11", help="the root's Python version (bookworm: 3.11)")
    parser.add_argument("--models", default="1.7b,4b")
    parser.add_argument("--forms", default="Q8_0,Q4_K_M")
    parser.add_argument("--n1", type=int, default=None, help="new tokens of the shorter count (2; --smollm2: 8)")
    parser.add_argument("--n2", type=int, default=None, help="new tokens of the longer count (6; --smollm2: 40)")
    parser.add_argument("--cores", type=int, default=4)
    parser.add_argument("--ghz", type=float, default=2.4)
    parser.add_argument("--ipc", type=float, default=2.0)
    parser.add_argument("--gbps", type=float, default=15.0)
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument("--products", default="auto", choices=("auto", "exact", "integer"),
                        help="kestrel-trio's products of quantized weights (auto: integer on aarch64)")
    parser.add_argument("--smollm2", metavar="FORMS", default=None,
                        help="count SmolLM2-135M-Instruct instead, at these forms (e.g. Q8_0,Q4_0,Q4_1: the shipped "
                             "Q4_1 file, the others made from it by --llama-quantize), against --bound")
    parser.add_argument("--llama-build", type=Path, default=None,
                        help="llama.cpp's aarch64 CMake build directory (static libraries; --smollm2)")
    parser.add_argument("--llama-quantize", default=None, help="llama.cpp's llama-quantize for aarch64 (--smollm2)")
    parser.add_argument("--bound", type=float, default=1.5,
                        help="the ratio kestrel / llama.cpp each --smollm2 form must stay within (the integer-"
                             "products issue: 1.5 as cortex-a76, 2 as cortex-a53)")
    args = parser.parse_args()
    args.n1 = args.n1 if args.n1 is not None else (8 if args.smollm2 else 2)
    args.n2 = args.n2 if args.n2 is not None else (40 if args.smollm2 else 6)
    if args.smollm2:
        return smollm2_counts(args)

    if args.llama_bench is None:
        parser.error("--llama-bench is needed (or --smollm2)")
    from bench_http import copy_vocab_from
    from kestrel_trio.hub import NAMED_MODELS, fetch_named_model, kestrel_cache_dir

    smollm = fetch_named_model(NAMED_MODELS["smollm2-135m"], kestrel_cache_dir())[0]
    add_vocab = copy_vocab_from(smollm, VOCAB)  # a real BPE vocabulary, padded to Qwen3's rows
    print(f"qemu CPU {args.cpu}; kestrel-trio from {REPO}; llama.cpp {args.llama_bench}; tokens {args.n1}->{args.n2}")
    table = []
    for model in args.models.split(","):
        for form in args.forms.split(","):
            variants = {"plain1": [False], "plain2": [False, False]}
            if form != "Q8_0":
                variants["more2"] = [False, True]
            files = {key: args.cache / f"qwen3-{model}-{form}-{key}.gguf" for key in variants}
            for key, layers in variants.items():
                build_file(files[key], model, form, layers, add_vocab)
            print(f"Qwen3-{model} shapes, {form}:", flush=True)
            ours = whole_step(measure(args, "kestrel", files), model, form)
            theirs = whole_step(measure(args, "llama.cpp", files), model, form)
            table.append((model, form, step_bytes(model, form), ours, theirs))
    print(f"\nOne decode step, whole model (from the truncated files), under qemu -cpu {args.cpu}; estimate at "
          f"{args.ghz} GHz, IPC {args.ipc}, {args.gbps} GB/s")
    print("| model | form | weight MB a step | llama.cpp M instr | kestrel M instr | ratio | "
          f"llama.cpp tok/s (1 / {args.cores} cores) | kestrel tok/s (1 / {args.cores} cores) |")
    print("|---|---|---|---|---|---|---|---|")
    for model, form, weight_bytes, ours, theirs in table:
        speeds = [f"{estimate(n, weight_bytes, args, 1):.1f} / {estimate(n, weight_bytes, args, args.cores):.1f}"
                  for n in (theirs, ours)]
        print(f"| Qwen3-{model} | {form} | {weight_bytes / 1e6:.0f} | {theirs / 1e6:.0f} | {ours / 1e6:.0f} | "
              f"{ours / theirs:.1f}x | {speeds[0]} | {speeds[1]} |")
    print(json.dumps([dict(zip(("model", "form", "bytes", "kestrel", "llama_cpp"), row)) for row in table]))


if __name__ == "__main__":
    main()
