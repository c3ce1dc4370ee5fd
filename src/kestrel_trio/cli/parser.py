"""The ``kestrel-trio`` argument parser: its commands, and the flags only ``serve`` takes.

Each default shown in ``--help`` is read from where it lives (the engine's,
HTTP's and the image/video policies' attrs fields, ``serve()``'s signature).
"""

from __future__ import annotations

import argparse
import inspect
import math
import os
from typing import Sequence

from kestrel_trio._model import KV_DTYPES
from kestrel_trio.app import ImagePolicy, VideoPolicy
from kestrel_trio.app.state import OPEN_PATHS
from kestrel_trio.cli.flags import (COUNT, POSITIVE_SECONDS, SECONDS, add_model_args, add_sampling_args,
                                    add_sampling_choices, add_speculative_args, at_least, cors_origin,
                                    existing_folder, limit_defaults, mib, tcp_port)
from kestrel_trio.engine import EngineLimits
from kestrel_trio.http import HttpLimits
from kestrel_trio.server import DEFAULT_CHAT_MAX_TOKENS, DEMO_DEFAULT_MAX_TOKENS
from kestrel_trio.server import serve as serve_function
from kestrel_trio.hub.commands import HUB_COMMANDS, add_hub_commands

__all__ = ["COMMANDS", "DESCRIPTION", "build_parser"]

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
    add_model_args(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)")
    serve.add_argument("--port", type=tcp_port, default=os.environ.get("KESTREL_PORT", "8000"),
                       help="TCP port; 0 picks a free one (default: $KESTREL_PORT, else 8000)")
    serve.add_argument("--model-id", default=None, help="the model id clients use (default: the folder name)")
    engine, http, image = limit_defaults(EngineLimits), limit_defaults(HttpLimits), limit_defaults(ImagePolicy)
    video = limit_defaults(VideoPolicy)
    serving = {name: p.default for name, p in inspect.signature(serve_function).parameters.items()}
    serve.add_argument("--max-queued", type=COUNT, default=engine["max_queued"],
                       help=f"requests that may wait; more get 429 (default {engine['max_queued']})")
    serve.add_argument("--max-batch", type=COUNT, default=engine["max_batch"],
                       help=f"generations stepped together (default {engine['max_batch']})")
    prefix_cache_mb = engine["prefix_cache_bytes"] / 2**20
    serve.add_argument("--prefix-cache-mb", type=SECONDS, default=prefix_cache_mb,
                       help=f"MiB of prompt KV kept for reuse by prompts with the same beginning (default "
                            f"{prefix_cache_mb:g}; 0: off)")
    serve.add_argument("--max-model-len", type=COUNT, default=engine["max_model_len"], metavar="TOKENS",
                       help="longest sequence served, prompt + generated tokens (default and maximum: the model's "
                            "context)")
    kv_cache_mb = None if engine["kv_cache_bytes"] is None else engine["kv_cache_bytes"] / 2**20
    serve.add_argument("--kv-cache-mb", type=at_least(1.0, float), default=kv_cache_mb, metavar="MIB",
                       help="MiB of KV cache for every running generation and the prefix cache together; a request "
                            "waits for room, or gets 400 if it can never fit (default: "
                            + ("what --max-batch sequences at the context cap and the prefix cache can hold, "
                               "at most half the memory available at start" if kv_cache_mb is None
                               else f"{kv_cache_mb:g}")
                            + ")")
    serve.add_argument("--kv-dtype", choices=list(KV_DTYPES), default=engine["kv_dtype"],
                       help=f"KV cache storage: bf16 or fp16 hold twice the tokens; compute stays fp32 "
                            f"(default {engine['kv_dtype']})")
    serve.add_argument("--max-connections", type=COUNT, default=http["max_connections"],
                       help=f"open connections; more get 503 (default {http['max_connections']}; the open-files limit "
                            "is raised to fit)")
    serve.add_argument("--host-allowlist", action="append", dest="host_allowlist", metavar="HOST", default=None,
                       help="a Host header name (or name:port) answered; others get 403, against DNS rebinding "
                            "(repeatable or comma-separated; '*': any; default: when listening on loopback without "
                            "--api-key, localhost, 127.0.0.1, [::1] and the bound address; otherwise any)")
    serve.add_argument("--max-connections-per-client", type=COUNT, default=None, metavar="N",
                       help="open connections one peer address may hold; more get 503 (default: a quarter of "
                            "--max-connections for other hosts, no cap for loopback peers such as a local proxy)")
    serve.add_argument("--open-path", action="append", dest="open_paths", metavar="PATH", default=None,
                       help=f"a path that needs no API key (repeatable; default {' and '.join(sorted(OPEN_PATHS))})")
    serve.add_argument("--api-key", default=os.environ.get("KESTREL_API_KEY"),
                       help="require 'Authorization: Bearer KEY' (default: $KESTREL_API_KEY; /health stays open)")
    serve.add_argument("--max-header-bytes", type=COUNT, default=http["max_header_bytes"],
                       help=f"largest request head in bytes; more gets 431 (default {http['max_header_bytes']})")
    serve.add_argument("--max-body-bytes", type=COUNT, default=http["max_body_bytes"],
                       help=f"largest request body in bytes; more gets 413 (default {mib(http['max_body_bytes'])})")
    serve.add_argument("--default-max-tokens", type=at_least(0), default=None, metavar="N",
                       help="most new tokens for a request that sets no max_tokens: chat stops there instead of at "
                            "the end of the context, completions keep OpenAI's 16 unless N is lower; 0: no cap, "
                            f"OpenAI's behaviour (default {DEFAULT_CHAT_MAX_TOKENS}; {DEMO_DEFAULT_MAX_TOKENS} on the "
                            "demo model)")
    serve.add_argument("--reasoning", choices=("auto", "on", "off"), default="auto",
                       help="whether a chat request that does not say (reasoning_effort, enable_thinking, "
                            "Anthropic's thinking) gets reasoning: auto leaves it to the model's chat template "
                            "(Qwen3 reasons), on and off switch it where the model can (default auto)")
    serve.add_argument("--prefill-chunk", type=COUNT, default=engine["prefill_chunk"],
                       help=f"prompt tokens per model step: bounds how long running streams wait (default "
                            f"{engine['prefill_chunk']})")
    serve.add_argument("--header-timeout", type=POSITIVE_SECONDS, default=http["header_timeout"],
                       help=f"seconds to receive a request head (default {http['header_timeout']:g})")
    serve.add_argument("--body-timeout", type=POSITIVE_SECONDS, default=http["body_timeout"],
                       help=f"seconds to receive a request body (default {http['body_timeout']:g})")
    serve.add_argument("--keepalive-timeout", type=POSITIVE_SECONDS, default=http["keepalive_timeout"],
                       help=f"idle seconds on a keep-alive connection (default {http['keepalive_timeout']:g})")
    serve.add_argument("--write-timeout", type=POSITIVE_SECONDS, default=http["write_timeout"],
                       help=f"seconds a stalled write may take (default {http['write_timeout']:g})")
    serve.add_argument("--linger-timeout", type=SECONDS, default=http["linger_timeout"],
                       help="seconds spent draining a connection after the server half-closed it, so the client "
                            f"reads the last response instead of a reset (default {http['linger_timeout']:g})")
    serve.add_argument("--grace", type=SECONDS, default=serving["grace"],
                       help=f"seconds running requests get once the listener is closed on shutdown (default "
                            f"{serving['grace']:g})")
    serve.add_argument("--cors-origin", action="append", dest="cors_origins", metavar="ORIGIN", type=cors_origin,
                       default=[], help="let web pages from ORIGIN (scheme://host[:port], or * for any) call the API "
                                        "from a browser (repeatable; default: none; the API key still applies)")
    serve.add_argument("--no-webui", action="store_false", dest="webui",
                       help="do not serve the built-in chat page at / (default: served)")
    serve.add_argument("--drain-delay", type=SECONDS, default=serving["drain_delay"],
                       help=f"seconds to keep serving after SIGTERM while /health says draining (default "
                            f"{serving['drain_delay']:g})")
    add_speculative_args(serve, engine)
    add_sampling_choices(serve.add_argument_group(
        "sampling defaults", "each applies to a request that leaves the field out; without the flag, the model's "
        "own default applies (its generation_config.json, or a named model's publisher's), else the one named"),
        "the model's")
    images = serve.add_argument_group("images (Qwen3-VL models)")
    images.add_argument("--allow-image-dir", metavar="DIR", type=existing_folder, default=None,
                        help="let file:// image and video URLs name files under DIR (default: none; http(s) URLs are "
                             "never fetched)")
    images.add_argument("--max-image-bytes", type=COUNT, default=image["max_bytes"],
                        help=f"largest encoded image in bytes (default {mib(image['max_bytes'])})")
    side = math.isqrt(image["max_pixels"])
    images.add_argument("--max-image-pixels", type=COUNT, default=image["max_pixels"],
                        help=f"largest image width*height before resizing (default {image['max_pixels'] // 2**20} Mpx, "
                             f"{side}x{side})")
    images.add_argument("--max-images", type=at_least(0), default=image["max_images"],
                        help=f"images per request (default {image['max_images']})")
    videos = serve.add_argument_group("videos (Qwen3-VL models; video files need the 'video' extra, PyAV)")
    videos.add_argument("--video-fps", type=at_least(1e-3, float), default=None, metavar="FPS",
                        help="frames sampled per second of video (default: the model's video config, 2 for Qwen3-VL)")
    videos.add_argument("--max-video-frames", type=at_least(2), default=video["max_frames"], metavar="N",
                        help=f"most frames sampled from one video (default {video['max_frames']})")
    videos.add_argument("--max-video-bytes", type=COUNT, default=video["max_bytes"],
                        help=f"largest encoded video in bytes (default {mib(video['max_bytes'])})")
    videos.add_argument("--max-video-pixels", type=COUNT, default=video["max_pixels"],
                        help=f"largest video frame width*height before resizing (default {video['max_pixels']})")
    videos.add_argument("--max-videos", type=at_least(0), default=video["max_videos"],
                        help=f"videos per request (default {video['max_videos']})")

    generate = add_command("generate", "[--model MODEL] [options] PROMPT",
                           "stream one completion of a prompt to the terminal")
    add_model_args(generate)
    add_sampling_args(generate)
    generate.add_argument("prompt", help="the user message")
    generate.add_argument("--raw", action="store_true",
                          help="send the prompt as is, without the chat template (default: off, templated)")

    chat = add_command("chat", "[--model MODEL] [options]",
                       "interactive multi-turn chat (/help lists its commands, Ctrl-C stops an answer)")
    add_model_args(chat)
    add_sampling_args(chat)
    add_hub_commands(add_command)  # pull, list, rm
    return parser

