"""The ``kestrel-trio`` command: serve, generate, chat, and pull, list, rm (kestrel_trio.hub.commands).

The only module that reads argv and calls ``trio.run``.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import logging
import math
import os
import signal
import sys
from typing import NoReturn, Sequence

if sys.version_info < (3, 11):  # trio depends on the backport there
    from exceptiongroup import BaseExceptionGroup

import attrs

from kestrel_trio._model import KV_DTYPES
from kestrel_trio.app import ImagePolicy, VideoPolicy
from kestrel_trio.app.state import OPEN_PATHS
from kestrel_trio.engine import EngineLimits
from kestrel_trio.errors import KestrelError
from kestrel_trio.http import HttpLimits
from kestrel_trio.model import CheckedModel
from kestrel_trio.server import DEFAULT_CHAT_MAX_TOKENS, DEMO_DEFAULT_MAX_TOKENS
from kestrel_trio.server import serve as serve_function
from kestrel_trio.hub.commands import HUB_COMMANDS, MODEL_HELP, add_hub_commands, resolve_model_arg, run_hub_command

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


def _origin(text: str) -> str:
    from kestrel_trio.http.cors import normalize_origin

    try:
        return normalize_origin(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_COUNT = _at_least(1)
_SECONDS = _at_least(0.0, float)
_POSITIVE_SECONDS = _at_least(1e-3, float)


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", metavar="MODEL", default=None, help=MODEL_HELP)
    parser.add_argument("--mmproj", metavar="FILE", default=None,
                        help="the vision tower of a Qwen3-VL GGUF --model: llama.cpp's mmproj GGUF file "
                             "(projector qwen3vl_merger; F32, F16, BF16 or Q8_0), so that it takes images (default: "
                             "none, or the projector a hub GGUF repo holds beside a Qwen3-VL --model)")
    parser.add_argument("--weights", choices=["auto", "fp32", "bf16", "int8", "int4", "gguf"], default="auto",
                        help="weights in memory (docs/memory.md): fp32 copies; bf16 mapped from the checkpoint; "
                             "int8 or int4, a checkpoint folder quantized at load (and cached); gguf, a GGUF file's "
                             "tensors as stored, mapped; auto: for a folder the first of fp32, bf16, int8, int4 "
                             "that fits the memory available, for a GGUF file gguf (default auto)")
    parser.add_argument("--quantized-cache", metavar="DIR", default=None,
                        help="where int8/int4 weights are cached so the next load maps them, or 'off' "
                             "(default: ~/.cache/kestrel-trio/quantized)")
    parser.add_argument("--blas-threads", type=_COUNT, default=None,
                        help="threads numpy's BLAS may use (default: one per core)")
    parser.add_argument("--prefill-precision", choices=("fp32", "bf16"), default=None,
                        help="how prompts are multiplied with float32 weights: fp32, or bf16 in AMX tiles "
                             "(Intel Sapphire Rapids and later; faster prefill, logits within about 0.5%%; "
                             "docs/performance.md) (default fp32)")
    parser.add_argument("--exact-products", action="store_true",
                        help="multiply quantized GGUF weights exactly: each weight expanded to float32, as the "
                             "reference does, instead of llama.cpp's integer products with the activations "
                             "quantized to int8 (the default on aarch64 and on x86-64 with AVX2 for Q8_0, Q4_0, "
                             "Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K; logits within a few percent)")


def _add_speculative_args(serve: argparse.ArgumentParser, engine: dict) -> None:
    from kestrel_trio.text.speculative import DEFAULT_SPECULATIVE_TOKENS, MAX_SPECULATIVE_TOKENS, SPECULATIVE_MODES

    group = serve.add_argument_group("speculative decoding (batch 1; docs/performance.md)")
    group.add_argument("--speculative", choices=list(SPECULATIVE_MODES), default=None,
                       help="draft tokens and verify them in one forward pass when a single generation runs: "
                            "ngram drafts from the prompt and output so far (prompt lookup), draft from "
                            f"--draft-model (default {engine['speculative']}; draft with --draft-model)")
    group.add_argument("--draft-model", metavar="MODEL", default=None,
                       help="a small model with the same tokenizer that drafts tokens (as --model: a folder, "
                            ".gguf file, hub repo id or named model); implies --speculative draft (default: none)")
    defaults = ", ".join(f"{count} for {mode}" for mode, count in DEFAULT_SPECULATIVE_TOKENS.items())
    group.add_argument("--speculative-tokens", metavar="K", default=None, type=_at_least(1),
                       help=f"tokens drafted per step, 1 to {MAX_SPECULATIVE_TOKENS} (default {defaults})")


def _check_speculative_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Settle ``args.speculative`` from the three flags, or stop with argparse's one-line usage error."""
    from kestrel_trio.text.speculative import MAX_SPECULATIVE_TOKENS

    if args.draft_model is not None:
        if args.speculative not in (None, "draft"):
            parser.error(f"--draft-model drafts for --speculative draft, not {args.speculative}: choose one")
        args.speculative = "draft"
    elif args.speculative == "draft":
        parser.error("--speculative draft needs --draft-model MODEL")
    args.speculative = args.speculative or "off"
    if args.speculative_tokens is not None:
        if args.speculative == "off":
            parser.error("--speculative-tokens needs --speculative ngram or --draft-model")
        if args.speculative_tokens > MAX_SPECULATIVE_TOKENS:
            parser.error(f"argument --speculative-tokens: must be <= {MAX_SPECULATIVE_TOKENS}, "
                         f"got {args.speculative_tokens}")


def _quantized_cache(args: argparse.Namespace) -> str | bool:
    """load_model's quantized_cache from --quantized-cache: True (the default folder), False ('off') or a folder."""
    if args.quantized_cache is None:
        return True
    return False if args.quantized_cache == "off" else args.quantized_cache


def _sampling(field: str, kind: type):
    """An argparse type: a value of SamplingParams' ``field``, refused with the message the server would give.

    The ranges live in one place, SamplingParams' validators; checking here
    refuses a bad value before the model loads.
    """

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
        from kestrel_trio.errors import BadRequestError
        from kestrel_trio.text import SamplingParams

        try:
            SamplingParams(**{field: value})
        except BadRequestError as exc:
            raise argparse.ArgumentTypeError(exc.message) from None
        return value

    return parse


def _repetition_guard(text: str):
    """An argparse type: a RepetitionGuard from WINDOW:REPEATS."""
    from kestrel_trio.errors import BadRequestError
    from kestrel_trio.text.repetition import RepetitionGuard

    try:
        return RepetitionGuard.parse(text)
    except BadRequestError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def _add_sampling_choices(parser: argparse.ArgumentParser | argparse._ArgumentGroup, default: str) -> None:
    """The sampling flags ``serve``, ``generate`` and ``chat`` share (llama-server's names); ``default``: whose
    value applies when one is not given."""
    parser.add_argument("--temperature", type=_sampling("temperature", float), default=None,
                        help=f"0 to 2; 0 for greedy (default: {default}, else 1)")
    parser.add_argument("--top-p", type=_sampling("top_p", float), default=None,
                        help=f"nucleus sampling mass, above 0 and at most 1 (default: {default}, else 1, off)")
    parser.add_argument("--top-k", type=_sampling("top_k", int), default=None,
                        help=f"sample from the k most likely tokens; 0 or -1 off (default: {default}, else off)")
    parser.add_argument("--min-p", type=_sampling("min_p", float), default=None,
                        help=f"drop tokens less likely than MIN_P times the most likely one, 0 to 1 (default: "
                             f"{default}, else 0, off)")
    parser.add_argument("--repeat-penalty", "--repetition-penalty", dest="repetition_penalty", metavar="PENALTY",
                        type=_sampling("repetition_penalty", float), default=None,
                        help="divide the logits of tokens already in the prompt or answer by this (over the whole "
                             f"sequence, as transformers and vLLM do), 0.01 to 100; 1 off (default: {default}, "
                             "else 1)")
    parser.add_argument("--repetition-guard", metavar="WINDOW:REPEATS", type=_repetition_guard, default=None,
                        help="end an answer (finish_reason length) once its last WINDOW tokens are REPEATS or more "
                             "copies of one cycle, e.g. 128:4 (default: off)")


def _add_sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=_sampling("max_tokens", int), default=256,
                        help="most tokens to generate, >= 1 (default 256)")
    _add_sampling_choices(parser, "the model's")
    parser.add_argument("--seed", type=_sampling("seed", int), default=None,
                        help="seed for reproducible sampling (default: none, a fresh random seed)")
    parser.add_argument("--no-think", action="store_true",
                        help="disable Qwen3 thinking, enable_thinking=false (default: off, the model may think)")


def _sampling_defaults(args: argparse.Namespace):
    """serve's SamplingDefaults from its sampling flags."""
    from kestrel_trio.text.sampling import SamplingDefaults

    return SamplingDefaults(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
                            repetition_penalty=args.repetition_penalty, repetition_guard=args.repetition_guard)


_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
COMMANDS = ("serve", "generate", "chat", *HUB_COMMANDS)
DESCRIPTION = "An OpenAI-compatible inference server for Qwen and Llama-family models, on trio."


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose unknown arguments are reported by the subcommand they were given to.

    argparse hands a subcommand's leftovers back to the top-level parser, which
    reports them with the top-level usage; parsing known arguments first lets
    the subcommand's own parser name them, under its own usage, with a
    suggestion for a mistyped flag.
    """

    subcommands: dict[str, argparse.ArgumentParser]

    def parse_args(self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None):
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            parser = self.subcommands.get(getattr(parsed, "command", None) or "", self)
            parser.error(f"unrecognized arguments: {' '.join(extras)}{_suggestion(parser, extras)}")
        return parsed


def _suggestion(parser: argparse.ArgumentParser, extras: Sequence[str]) -> str:
    """" (did you mean --port?)" for the first unknown flag close to a known one, else ""."""
    import difflib

    known = [option for action in parser._actions for option in action.option_strings]
    for extra in extras:
        if extra.startswith("--"):
            close = difflib.get_close_matches(extra.split("=", 1)[0], known, n=1, cutoff=0.6)
            if close:
                return f" (did you mean {close[0]}?)"
    return ""


def _add_global_args(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """Flags every command takes, before or after its name (a subcommand's copy leaves the top-level value alone)."""
    from kestrel_trio.version import __version__

    parser.add_argument("--version", action="version", version=f"kestrel-trio {__version__}",
                        help="print the version and exit")
    parser.add_argument("--log-level", type=str.upper, choices=_LOG_LEVELS,
                        default="INFO" if top else argparse.SUPPRESS,
                        help="log messages of this level and above; DEBUG also shows tracebacks of errors "
                             "(default INFO)")


def build_parser() -> argparse.ArgumentParser:
    """The ``kestrel-trio`` argument parser (``parse_args`` names unknown flags under their subcommand's usage)."""
    choices = "{" + ",".join(COMMANDS) + "}"
    parser = _Parser(prog="kestrel-trio", description=DESCRIPTION,
                     usage=f"%(prog)s [-h] [--version] [--log-level LEVEL] {choices} ...",
                     epilog="'kestrel-trio COMMAND --help' lists a command's options. Run with no command, "
                            "kestrel-trio prints this help and exits 0.")
    _add_global_args(parser, top=True)
    commands = parser.add_subparsers(dest="command", title="commands", metavar=choices,
                                     parser_class=argparse.ArgumentParser)
    parser.subcommands = {}

    def add_command(name: str, usage: str, help: str, description: str | None = None) -> argparse.ArgumentParser:
        command = commands.add_parser(name, prog=f"kestrel-trio {name}", help=help, description=description or help,
                                      usage=f"%(prog)s {usage}")
        _add_global_args(command, top=False)
        parser.subcommands[name] = command
        return command

    serve = add_command("serve", "[--model MODEL] [--host HOST] [--port PORT] [options]",
                        "serve the OpenAI-compatible HTTP API")
    _add_model_args(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)")
    serve.add_argument("--port", type=_port, default=os.environ.get("KESTREL_PORT", "8000"),
                       help="TCP port; 0 picks a free one (default: $KESTREL_PORT, else 8000)")
    serve.add_argument("--model-id", default=None, help="the model id clients use (default: the folder name)")
    engine, http, image = _defaults(EngineLimits), _defaults(HttpLimits), _defaults(ImagePolicy)
    video = _defaults(VideoPolicy)
    serving = {name: p.default for name, p in inspect.signature(serve_function).parameters.items()}
    serve.add_argument("--max-queued", type=_COUNT, default=engine["max_queued"],
                       help=f"requests that may wait; more get 429 (default {engine['max_queued']})")
    serve.add_argument("--max-batch", type=_COUNT, default=engine["max_batch"],
                       help=f"generations stepped together (default {engine['max_batch']})")
    prefix_cache_mb = engine["prefix_cache_bytes"] / 2**20
    serve.add_argument("--prefix-cache-mb", type=_SECONDS, default=prefix_cache_mb,
                       help=f"MiB of prompt KV kept for reuse by prompts with the same beginning (default "
                            f"{prefix_cache_mb:g}; 0: off)")
    serve.add_argument("--max-model-len", type=_COUNT, default=engine["max_model_len"], metavar="TOKENS",
                       help="longest sequence served, prompt + generated tokens (default and maximum: the model's context)")
    kv_cache_mb = None if engine["kv_cache_bytes"] is None else engine["kv_cache_bytes"] / 2**20
    serve.add_argument("--kv-cache-mb", type=_at_least(1.0, float), default=kv_cache_mb, metavar="MIB",
                       help="MiB of KV cache for every running generation and the prefix cache together; a request "
                            "waits for room, or gets 400 if it can never fit (default: "
                            + ("what --max-batch sequences at the context cap and the prefix cache can hold, "
                               "at most half the memory available at start" if kv_cache_mb is None
                               else f"{kv_cache_mb:g}")
                            + ")")
    serve.add_argument("--kv-dtype", choices=list(KV_DTYPES), default=engine["kv_dtype"],
                       help=f"KV cache storage: bf16 or fp16 hold twice the tokens; compute stays fp32 "
                            f"(default {engine['kv_dtype']})")
    serve.add_argument("--max-connections", type=_COUNT, default=http["max_connections"],
                       help=f"open connections; more get 503 (default {http['max_connections']}; the open-files limit "
                            "is raised to fit)")
    serve.add_argument("--host-allowlist", action="append", dest="host_allowlist", metavar="HOST", default=None,
                       help="a Host header name (or name:port) answered; others get 403, against DNS rebinding "
                            "(repeatable or comma-separated; '*': any; default: when listening on loopback without "
                            "--api-key, localhost, 127.0.0.1, [::1] and the bound address; otherwise any)")
    serve.add_argument("--max-connections-per-client", type=_COUNT, default=None, metavar="N",
                       help="open connections one peer address may hold; more get 503 (default: a quarter of "
                            "--max-connections for other hosts, no cap for loopback peers such as a local proxy)")
    serve.add_argument("--open-path", action="append", dest="open_paths", metavar="PATH", default=None,
                       help=f"a path that needs no API key (repeatable; default {' and '.join(sorted(OPEN_PATHS))})")
    serve.add_argument("--api-key", default=os.environ.get("KESTREL_API_KEY"),
                       help="require 'Authorization: Bearer KEY' (default: $KESTREL_API_KEY; /health stays open)")
    serve.add_argument("--max-header-bytes", type=_COUNT, default=http["max_header_bytes"],
                       help=f"largest request head in bytes; more gets 431 (default {http['max_header_bytes']})")
    serve.add_argument("--max-body-bytes", type=_COUNT, default=http["max_body_bytes"],
                       help=f"largest request body in bytes; more gets 413 (default {_mib(http['max_body_bytes'])})")
    serve.add_argument("--default-max-tokens", type=_at_least(0), default=None, metavar="N",
                       help="most new tokens for a request that sets no max_tokens: chat stops there instead of at "
                            "the end of the context, completions keep OpenAI's 16 unless N is lower; 0: no cap, "
                            f"OpenAI's behaviour (default {DEFAULT_CHAT_MAX_TOKENS}; {DEMO_DEFAULT_MAX_TOKENS} on the "
                            "demo model)")
    serve.add_argument("--reasoning", choices=("auto", "on", "off"), default="auto",
                       help="whether a chat request that does not say (reasoning_effort, enable_thinking, "
                            "Anthropic's thinking) gets reasoning: auto leaves it to the model's chat template "
                            "(Qwen3 reasons), on and off switch it where the model can (default auto)")
    serve.add_argument("--prefill-chunk", type=_COUNT, default=engine["prefill_chunk"],
                       help=f"prompt tokens per model step: bounds how long running streams wait (default "
                            f"{engine['prefill_chunk']})")
    serve.add_argument("--header-timeout", type=_POSITIVE_SECONDS, default=http["header_timeout"],
                       help=f"seconds to receive a request head (default {http['header_timeout']:g})")
    serve.add_argument("--body-timeout", type=_POSITIVE_SECONDS, default=http["body_timeout"],
                       help=f"seconds to receive a request body (default {http['body_timeout']:g})")
    serve.add_argument("--keepalive-timeout", type=_POSITIVE_SECONDS, default=http["keepalive_timeout"],
                       help=f"idle seconds on a keep-alive connection (default {http['keepalive_timeout']:g})")
    serve.add_argument("--write-timeout", type=_POSITIVE_SECONDS, default=http["write_timeout"],
                       help=f"seconds a stalled write may take (default {http['write_timeout']:g})")
    serve.add_argument("--linger-timeout", type=_SECONDS, default=http["linger_timeout"],
                       help="seconds spent draining a connection after the server half-closed it, so the client "
                            f"reads the last response instead of a reset (default {http['linger_timeout']:g})")
    serve.add_argument("--grace", type=_SECONDS, default=serving["grace"],
                       help=f"seconds running requests get once the listener is closed on shutdown (default "
                            f"{serving['grace']:g})")
    serve.add_argument("--cors-origin", action="append", dest="cors_origins", metavar="ORIGIN", type=_origin,
                       default=[], help="let web pages from ORIGIN (scheme://host[:port], or * for any) call the API "
                                        "from a browser (repeatable; default: none; the API key still applies)")
    serve.add_argument("--no-webui", action="store_false", dest="webui",
                       help="do not serve the built-in chat page at / (default: served)")
    serve.add_argument("--drain-delay", type=_SECONDS, default=serving["drain_delay"],
                       help=f"seconds to keep serving after SIGTERM while /health says draining (default "
                            f"{serving['drain_delay']:g})")
    _add_speculative_args(serve, engine)
    _add_sampling_choices(serve.add_argument_group(
        "sampling defaults", "each applies to a request that leaves the field out; without the flag, the model's "
        "own default applies (its generation_config.json, or a named model's publisher's), else the one named"),
        "the model's")
    images = serve.add_argument_group("images (Qwen3-VL models)")
    images.add_argument("--allow-image-dir", metavar="DIR", type=_folder, default=None,
                        help="let file:// image and video URLs name files under DIR (default: none; http(s) URLs are "
                             "never fetched)")
    images.add_argument("--max-image-bytes", type=_COUNT, default=image["max_bytes"],
                        help=f"largest encoded image in bytes (default {_mib(image['max_bytes'])})")
    side = math.isqrt(image["max_pixels"])
    images.add_argument("--max-image-pixels", type=_COUNT, default=image["max_pixels"],
                        help=f"largest image width*height before resizing (default {image['max_pixels'] // 2**20} Mpx, "
                             f"{side}x{side})")
    images.add_argument("--max-images", type=_at_least(0), default=image["max_images"],
                        help=f"images per request (default {image['max_images']})")
    videos = serve.add_argument_group("videos (Qwen3-VL models; video files need the 'video' extra, PyAV)")
    videos.add_argument("--video-fps", type=_at_least(1e-3, float), default=None, metavar="FPS",
                        help="frames sampled per second of video (default: the model's video config, 2 for Qwen3-VL)")
    videos.add_argument("--max-video-frames", type=_at_least(2), default=video["max_frames"], metavar="N",
                        help=f"most frames sampled from one video (default {video['max_frames']})")
    videos.add_argument("--max-video-bytes", type=_COUNT, default=video["max_bytes"],
                        help=f"largest encoded video in bytes (default {_mib(video['max_bytes'])})")
    videos.add_argument("--max-video-pixels", type=_COUNT, default=video["max_pixels"],
                        help=f"largest video frame width*height before resizing (default {video['max_pixels']})")
    videos.add_argument("--max-videos", type=_at_least(0), default=video["max_videos"],
                        help=f"videos per request (default {video['max_videos']})")

    generate = add_command("generate", "[--model MODEL] [options] PROMPT",
                           "stream one completion of a prompt to the terminal")
    _add_model_args(generate)
    _add_sampling_args(generate)
    generate.add_argument("prompt", help="the user message")
    generate.add_argument("--raw", action="store_true",
                          help="send the prompt as is, without the chat template (default: off, templated)")

    chat = add_command("chat", "[--model MODEL] [options]",
                       "interactive multi-turn chat (/help lists its commands, Ctrl-C stops an answer)")
    _add_model_args(chat)
    _add_sampling_args(chat)
    add_hub_commands(add_command)  # pull, list, rm
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kestrel-trio`` console script; returns the exit code (``serve`` exits itself).

    Exit codes: 0 done (or help shown), 2 a usage error or a model folder that
    cannot be loaded, 1 a runtime failure (e.g. the port is in use), 130
    interrupted. Errors are one line, ``kestrel-trio: error: ...``;
    ``--log-level DEBUG`` adds the traceback.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    if args.command == "serve":
        _check_speculative_args(parser.subcommands["serve"], args)
    try:
        if args.command in HUB_COMMANDS:
            return run_hub_command(args)
        resolve_model_arg(args)  # a hub repo id or named model becomes a local path, downloaded once
        _take_repo_mmproj(args)
        checked = draft = None
        if args.model is not None:
            from kestrel_trio.model import check_model

            # In milliseconds, before any weights are read or any port bound; what it parsed goes on to the load.
            checked = check_model(args.model, weights=args.weights, mmproj=args.mmproj)
        elif args.mmproj is not None:
            from kestrel_trio.errors import ModelLoadError

            raise ModelLoadError("--mmproj goes with --model, a Qwen3-VL language model GGUF file")
        if getattr(args, "prefill_precision", None) is not None:
            from kestrel_trio.model import set_prefill_precision

            set_prefill_precision(args.prefill_precision)  # the models loaded next; a CPU without AMX fails here
        if getattr(args, "exact_products", False):
            from kestrel_trio.model import set_products

            set_products("exact")  # the models loaded next (the model and its draft)
        if getattr(args, "draft_model", None) is not None:
            draft = _check_draft_model(args)
        if args.command == "serve":
            return _serve(args, checked, draft)
        from kestrel_trio.cli_text import chat_loop, generate_once, load_with_progress

        model = load_with_progress(checked, weights=args.weights, blas_threads=args.blas_threads,
                                   quantized_cache=_quantized_cache(args))
        if args.command == "generate":
            return generate_once(model, args)
        return chat_loop(model, args)
    except (Exception, KeyboardInterrupt, BaseExceptionGroup) as exc:
        from kestrel_trio.cli_errors import report

        return report(exc, show_traceback=args.log_level == "DEBUG")


def _take_repo_mmproj(args: argparse.Namespace) -> None:
    """A GGUF repo's vision projector (fetched beside the model, as llama.cpp's -hf does) becomes ``--mmproj``
    when none is given and the model is a Qwen3-VL language model; other models leave it unused."""
    found = getattr(args, "repo_mmproj", None)
    if found is None or getattr(args, "mmproj", "absent") is not None:
        return
    from kestrel_trio.model import is_vl_language_gguf

    if is_vl_language_gguf(args.model):
        args.mmproj = found
        logging.getLogger("kestrel_trio.cli").info("using the repo's vision projector %s", found)


def _check_draft_model(args: argparse.Namespace) -> CheckedModel:
    """Resolve ``--draft-model`` as ``--model`` is, and check its config in milliseconds (``serve`` then checks
    its vocabulary against the model's, before any weights load or any port is bound)."""
    from kestrel_trio.hub import resolve_model
    from kestrel_trio.model import check_model

    args.draft_model = str(resolve_model(args.draft_model).path)
    return check_model(args.draft_model, weights=args.weights)


def _defaults(limits: type) -> dict:
    """The field defaults of an attrs limits class: each default lives there, once."""
    return {field.name: field.default for field in attrs.fields(limits)}


def _mib(size: int) -> str:
    return f"{size / 2**20:g} MiB"


def _host_names(values: list[str] | None) -> list[str] | None:
    """--host-allowlist's values, comma-separated ones split; None when the flag was not given."""
    return None if values is None else [name.strip() for value in values for name in value.split(",") if name.strip()]


def _serve(args: argparse.Namespace, model: CheckedModel | None, draft: CheckedModel | None) -> NoReturn:
    """``serve`` of ``model`` (and ``draft``) as checked from ``--model`` (``--draft-model``), not parsed again."""
    import trio

    from kestrel_trio.server import serve

    engine_limits = EngineLimits(max_queued=args.max_queued, max_batch=args.max_batch,
                                 prefill_chunk=args.prefill_chunk, prefix_cache_bytes=int(args.prefix_cache_mb * 2**20),
                                 max_model_len=args.max_model_len, kv_dtype=args.kv_dtype,
                                 speculative=args.speculative, speculative_tokens=args.speculative_tokens,
                                 kv_cache_bytes=None if args.kv_cache_mb is None else int(args.kv_cache_mb * 2**20))
    http_limits = HttpLimits(
        header_timeout=args.header_timeout, body_timeout=args.body_timeout, keepalive_timeout=args.keepalive_timeout,
        write_timeout=args.write_timeout, linger_timeout=args.linger_timeout, max_connections=args.max_connections,
        max_connections_per_client=args.max_connections_per_client, max_header_bytes=args.max_header_bytes, max_body_bytes=args.max_body_bytes,
    )
    _raise_open_files_limit(args.max_connections + _SPARE_FILES)
    open_paths = args.open_paths if args.open_paths is not None else OPEN_PATHS
    progress = None
    if args.model is not None:
        from kestrel_trio.cli_progress import LoadProgress, checkpoint_bytes

        progress = LoadProgress("loading weights", total_bytes=checkpoint_bytes(args.model, args.mmproj))
    start = functools.partial(
        serve, model, host=args.host, port=args.port, model_id=args.model_id, api_key=args.api_key,
        open_paths=open_paths, weights=args.weights, quantized_cache=_quantized_cache(args),
        blas_threads=args.blas_threads, engine_limits=engine_limits,
        http_limits=http_limits, grace=args.grace, drain_delay=args.drain_delay,
        image_policy=ImagePolicy(max_bytes=args.max_image_bytes, max_pixels=args.max_image_pixels,
                                 max_images=args.max_images),
        video_policy=VideoPolicy(fps=args.video_fps, max_frames=args.max_video_frames, max_bytes=args.max_video_bytes,
                                 max_pixels=args.max_video_pixels, max_videos=args.max_videos),
        allow_image_dir=args.allow_image_dir, default_max_tokens=args.default_max_tokens,
        sampling_defaults=_sampling_defaults(args), reasoning=args.reasoning,
        cors_origins=args.cors_origins, webui=args.webui, host_allowlist=_host_names(args.host_allowlist),
        progress=progress, draft_model=draft,
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
        if progress is not None:
            progress.close()  # a load that failed half-way leaves its bar's line open
        if _only_kestrel_error(group) is None:
            raise
        from kestrel_trio.cli_errors import report

        report(group, show_traceback=args.log_level == "DEBUG")
        _exit_without_finalizing(2)  # a KestrelError that stops start-up is the configuration's (e.g. --max-model-len)
    finally:
        if progress is not None:
            progress.close()  # a load that failed half-way leaves its bar's line open
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
