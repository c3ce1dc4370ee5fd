"""The ``kestrel-trio`` command's dispatch: argv parsed, the checks that hold between flags, and the command run
(serve, generate, chat, and pull, list, rm from kestrel_trio.hub.commands).

The console script and ``python -m kestrel_trio.cli`` call :func:`main` through the room's ``__init__``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

if sys.version_info < (3, 11):  # trio depends on the backport there
    from exceptiongroup import BaseExceptionGroup

from kestrel_trio.cli.flags import quantized_cache
from kestrel_trio.cli.parser import build_parser
from kestrel_trio.cli.serve import serve_command
from kestrel_trio.hub.commands import HUB_COMMANDS, resolve_model_arg, run_hub_command
from kestrel_trio.model import CheckedModel

__all__ = ["main"]


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
            return serve_command(args, checked, draft)
        from kestrel_trio.cli.text import chat_loop, generate_once, load_with_progress

        model = load_with_progress(checked, weights=args.weights, blas_threads=args.blas_threads,
                                   quantized_cache=quantized_cache(args))
        if args.command == "generate":
            return generate_once(model, args)
        return chat_loop(model, args)
    except (Exception, KeyboardInterrupt, BaseExceptionGroup) as exc:
        from kestrel_trio.cli.errors import report

        return report(exc, show_traceback=args.log_level == "DEBUG")


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

