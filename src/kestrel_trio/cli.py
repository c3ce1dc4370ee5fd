"""The ``kestrel-trio`` command: serve, generate, chat.

The only module that reads argv and calls ``trio.run``.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import sys
from typing import NoReturn, Sequence

from kestrel_trio.errors import KestrelError

__all__ = ["main"]

log = logging.getLogger("kestrel_trio.cli")


def _at_least(minimum: float, kind: type = int):
    """An argparse type: a number of ``kind`` that is >= ``minimum`` (argparse names the flag on failure)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
        if not value >= minimum:  # also refuses nan
            raise argparse.ArgumentTypeError(f"must be >= {minimum:g}, got {text}")
        return value

    return parse


def _port(text: str) -> int:
    port = _at_least(0)(text)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is 0 to 65535, got {port}")
    return port


def _folder(text: str) -> str:
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a folder")
    return text


_COUNT = _at_least(1)
_SECONDS = _at_least(0.0, float)
_POSITIVE_SECONDS = _at_least(1e-3, float)


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", metavar="DIR", default=None,
                        help="Hugging Face checkpoint folder (default: the built-in random demo model)")
    parser.add_argument("--weights", choices=["auto", "bf16", "fp32"], default="auto",
                        help="weights in memory: fp32 copies (fastest decode), bf16 mapped from the checkpoint "
                             "(half the memory, shared between processes), or auto: bf16 only when fp32 would "
                             "not fit (default auto)")
    parser.add_argument("--blas-threads", type=_COUNT, default=None,
                        help="threads numpy's BLAS may use (default: one per core)")


def _add_sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=256, help="most tokens to generate (default 256)")
    parser.add_argument("--temperature", type=float, default=None, help="0 for greedy (default: the checkpoint's)")
    parser.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass (default: the checkpoint's)")
    parser.add_argument("--seed", type=int, default=None, help="seed for reproducible sampling")
    parser.add_argument("--no-think", action="store_true", help="disable Qwen3 thinking (enable_thinking=false)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kestrel-trio", description="An OpenAI-compatible Qwen server on trio.")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve the OpenAI-compatible HTTP API")
    _add_model_args(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)")
    serve.add_argument("--port", type=_port, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    serve.add_argument("--model-id", default=None, help="the model id clients use (default: the folder name)")
    serve.add_argument("--max-queued", type=_COUNT, default=16, help="requests that may wait; more get 429 (default 16)")
    serve.add_argument("--max-batch", type=_COUNT, default=4, help="generations stepped together (default 4)")
    serve.add_argument("--prefix-cache-mb", type=_SECONDS, default=512.0,
                       help="MiB of prompt KV kept for reuse by prompts with the same beginning (default 512; 0: off)")
    serve.add_argument("--max-model-len", type=_COUNT, default=None, metavar="TOKENS",
                       help="longest sequence served, prompt + generated tokens (default and maximum: the model's context)")
    serve.add_argument("--kv-cache-mb", type=_at_least(1.0, float), default=None, metavar="MIB",
                       help="MiB of KV cache for every running generation and the prefix cache together; a request "
                            "waits for room, or gets 400 if it can never fit (default: derived from the memory "
                            "available at start)")
    serve.add_argument("--kv-dtype", choices=["fp32", "bf16", "fp16"], default="fp32",
                       help="KV cache storage: bf16 or fp16 hold twice the tokens; compute stays fp32 (default fp32)")
    serve.add_argument("--max-connections", type=_COUNT, default=1000,
                       help="open connections; more get 503 (default 1000; the open-files limit is raised to fit)")
    serve.add_argument("--open-path", action="append", dest="open_paths", metavar="PATH", default=None,
                       help="a path that needs no API key (repeatable; default /health and /metrics)")
    serve.add_argument("--api-key", default=os.environ.get("KESTREL_API_KEY"),
                       help="require 'Authorization: Bearer KEY' (default: $KESTREL_API_KEY; /health stays open)")
    serve.add_argument("--max-header-bytes", type=_COUNT, default=16 * 1024,
                       help="largest request head in bytes; more gets 431 (default 16384)")
    serve.add_argument("--max-body-bytes", type=_COUNT, default=4 * 2**20,
                       help="largest request body in bytes; more gets 413 (default 4 MiB)")
    serve.add_argument("--prefill-chunk", type=_COUNT, default=256,
                       help="prompt tokens per model step: bounds how long running streams wait (default 256)")
    serve.add_argument("--header-timeout", type=_POSITIVE_SECONDS, default=10.0, help="seconds to receive a request head")
    serve.add_argument("--body-timeout", type=_POSITIVE_SECONDS, default=30.0, help="seconds to receive a request body")
    serve.add_argument("--keepalive-timeout", type=_POSITIVE_SECONDS, default=5.0, help="idle seconds on a keep-alive connection")
    serve.add_argument("--write-timeout", type=_POSITIVE_SECONDS, default=30.0, help="seconds a stalled write may take")
    serve.add_argument("--linger-timeout", type=_SECONDS, default=1.0,
                       help="seconds spent draining a connection after the server half-closed it, so the client "
                            "reads the last response instead of a reset (default 1)")
    serve.add_argument("--grace", type=_SECONDS, default=10.0,
                       help="seconds running requests get once the listener is closed on shutdown (default 10)")
    serve.add_argument("--drain-delay", type=_SECONDS, default=0.0,
                       help="seconds to keep serving after SIGTERM while /health says draining (default 0)")
    images = serve.add_argument_group("images (Qwen3-VL models)")
    images.add_argument("--allow-image-dir", metavar="DIR", type=_folder, default=None,
                        help="let file:// image URLs name files under DIR (default: none; http(s) URLs are never fetched)")
    images.add_argument("--max-image-bytes", type=_COUNT, default=10 * 2**20,
                        help="largest encoded image in bytes (default 10 MiB)")
    images.add_argument("--max-image-pixels", type=_COUNT, default=4096 * 4096,
                        help="largest image width*height before resizing (default 16 Mpx, 4096x4096)")
    images.add_argument("--max-images", type=_at_least(0), default=4, help="images per request (default 4)")

    generate = commands.add_parser("generate", help="stream one completion of a prompt to the terminal")
    _add_model_args(generate)
    _add_sampling_args(generate)
    generate.add_argument("prompt", help="the user message")
    generate.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")

    chat = commands.add_parser("chat", help="interactive multi-turn chat (/reset clears history, Ctrl-C stops an answer)")
    _add_model_args(chat)
    _add_sampling_args(chat)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kestrel-trio`` console script; returns the exit code (``serve`` exits itself)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    try:
        if args.command == "serve":
            return _serve(args)
        from kestrel_trio.cli_text import chat_loop, generate_once, load_with_progress

        model = load_with_progress(args.model, weights=args.weights, blas_threads=args.blas_threads)
        if args.command == "generate":
            return generate_once(model, args)
        return chat_loop(model, args)
    except KestrelError as exc:
        print(f"kestrel-trio: error: {exc.message}", file=sys.stderr)
        return 2


def _serve(args: argparse.Namespace) -> NoReturn:
    import trio

    from kestrel_trio.engine import EngineLimits
    from kestrel_trio.http import HttpLimits
    from kestrel_trio.routes_images import ImagePolicy
    from kestrel_trio.server import serve

    engine_limits = EngineLimits(max_queued=args.max_queued, max_batch=args.max_batch,
                                 prefill_chunk=args.prefill_chunk, prefix_cache_bytes=int(args.prefix_cache_mb * 2**20),
                                 max_model_len=args.max_model_len, kv_dtype=args.kv_dtype,
                                 kv_cache_bytes=None if args.kv_cache_mb is None else int(args.kv_cache_mb * 2**20))
    http_limits = HttpLimits(
        header_timeout=args.header_timeout, body_timeout=args.body_timeout, keepalive_timeout=args.keepalive_timeout,
        write_timeout=args.write_timeout, linger_timeout=args.linger_timeout, max_connections=args.max_connections,
        max_header_bytes=args.max_header_bytes, max_body_bytes=args.max_body_bytes,
    )
    _raise_open_files_limit(args.max_connections + _SPARE_FILES)
    open_paths = args.open_paths if args.open_paths is not None else ("/health", "/metrics")
    start = functools.partial(
        serve, args.model, host=args.host, port=args.port, model_id=args.model_id, api_key=args.api_key,
        open_paths=open_paths, weights=args.weights, blas_threads=args.blas_threads, engine_limits=engine_limits, http_limits=http_limits, grace=args.grace, drain_delay=args.drain_delay,
        image_policy=ImagePolicy(max_bytes=args.max_image_bytes, max_pixels=args.max_image_pixels,
                                 max_images=args.max_images),
        allow_image_dir=args.allow_image_dir,
    )

    async def run() -> None:
        # What trio restores when the receiver closes, and re-delivers any signals still queued
        # to: a signal while trio and the interpreter wind down must not turn a clean exit into
        # death by signal.
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, _signal_while_exiting)
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:

                async def serve_until_done(*, task_status: trio.TaskStatus) -> None:
                    await start(task_status=task_status)
                    nursery.cancel_scope.cancel()  # serve returned: stop watching signals

                server = await nursery.start(serve_until_done)
                kv = server.engine.kv
                print(f"kestrel-trio: KV cache budget {kv.budget_bytes / 2**20:.1f} MiB = {kv.budget_tokens} tokens "
                      f"({kv.describe()}); context cap {server.engine.model.context_length} tokens", file=sys.stderr)
                print(f"kestrel-trio: serving {server.state.model_id} at {server.url}", file=sys.stderr, flush=True)
                nursery.start_soon(_watch_signals, signals, server, nursery.cancel_scope)

    try:
        trio.run(run)
    except BaseExceptionGroup as group:
        error = _only_kestrel_error(group)
        if error is None:
            raise
        print(f"kestrel-trio: error: {error.message}", file=sys.stderr)
        _exit_without_finalizing(2)
    _exit_without_finalizing(0)


def _only_kestrel_error(group: BaseExceptionGroup) -> KestrelError | None:
    """The KestrelError a failed start-up raised through trio's nurseries, if that is all the group holds."""
    matched, rest = group.split(KestrelError)
    if matched is None or rest is not None:
        return None
    while isinstance(matched, BaseExceptionGroup):
        matched = matched.exceptions[0]
    return matched


def _exit_without_finalizing(code: int) -> NoReturn:
    """End the process once the server has stopped, skipping the interpreter's finalization.

    Finalization puts the default signal handlers back while it tears modules
    down, so a SIGTERM then (a supervisor repeating itself) would end a clean
    shutdown as killed by signal. Nothing is left to finalize: the server's
    sockets, files and threads are closed; logs and stdio are flushed here.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


_SPARE_FILES = 64  # descriptors beyond the connections: listeners, checkpoint files, logs, worker threads


def _raise_open_files_limit(wanted: int) -> None:
    """Raise the soft open-files limit toward ``wanted`` (never past the hard limit), warning if it stays short."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        target = soft
    if target < wanted:
        log.warning("the open-files limit is %d, below --max-connections + %d; connections past it fail at accept",
                    target, _SPARE_FILES)


def _signal_while_exiting(signum: int, frame: object) -> None:
    log.warning("received %s while exiting: already stopping (SIGKILL forces it)", signal.Signals(signum).name)


async def _watch_signals(signals, server, scope) -> None:
    """First SIGINT/SIGTERM: graceful shutdown. A second one: stop at once."""
    async for signum in signals:
        if not server._shutdown.is_set():
            log.info("received %s: graceful shutdown", signal.Signals(signum).name)
            server.shutdown()
        else:
            log.warning("second signal: stopping now")
            scope.cancel()
            return


if __name__ == "__main__":
    sys.exit(main())
