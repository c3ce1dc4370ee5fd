"""The ``pull``, ``list`` and ``rm`` subcommands, and ``--model NAME`` resolution for the others.

kestrel_trio.cli stays the only code that reads argv: its parser hands its ``add_command`` (a
subcommand with the usage line and global flags of the others) to
:func:`add_hub_commands` and its parsed arguments to :func:`run_hub_command`
or :func:`resolve_model_arg`. Errors are raised as KestrelError for the cli's
one-line ``kestrel-trio: error: ...``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

from kestrel_trio.hub import (
    NAMED_MODELS, HubSettings, cached_models, kestrel_cache_dir, remove_model, resolve_model,
)
from kestrel_trio.hub.progress import format_bytes

__all__ = ["HUB_COMMANDS", "add_hub_commands", "run_hub_command", "resolve_model_arg", "MODEL_HELP"]

HUB_COMMANDS = ("pull", "list", "rm")
_NAMES = ", ".join(sorted(NAMED_MODELS))
MODEL_HELP = (f"a checkpoint folder, a .gguf file, a hub repo id (owner/name[@revision], or owner/name:QUANT for a "
              f"GGUF repo; downloaded once into the Hugging Face cache) or a named model ({_NAMES}) "
              "(default: the built-in random demo model)")


def add_hub_commands(add_command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``pull``, ``list`` and ``rm`` with kestrel_trio.cli.parser's
    ``add_command(name, usage, help, description=None)``, which gives each the usage line, the global flags
    (``--log-level``, ``--version``) and the error reporting of the other subcommands."""
    pull = add_command("pull", "[options] NAME", "download a model into the cache (nothing already cached is fetched)",
                       description="Download a model: " + MODEL_HELP.removesuffix(
                           " (default: the built-in random demo model)") + ". Prints its local path.")
    pull.add_argument("name", metavar="NAME", help="owner/name[:QUANT][@revision] or a named model")
    add_command("list", "[options]", "list cached models: id, format, size, path",
                description="List the cached models, named models first, then the hub's: id, format, size, path. "
                            "Looks in the kestrel-trio model cache ($XDG_CACHE_HOME/kestrel-trio/models) and the "
                            "Hugging Face cache ($HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub).")
    rm = add_command("rm", "[options] NAME", "delete a cached model (owner/name, owner/name:QUANT, "
                                             "owner/name@revision, or a named model)")
    rm.add_argument("name", metavar="NAME", help="as `kestrel-trio list` shows it")


def run_hub_command(args: argparse.Namespace) -> int:
    """Run ``pull``, ``list`` or ``rm``; the exit code."""
    if args.command == "pull":
        return _pull(args.name)
    if args.command == "list":
        return _list()
    return _rm(args.name)


def resolve_model_arg(args: argparse.Namespace) -> None:
    """Replace ``args.model`` (a repo id or named model) by its local path, downloading it once.

    ``serve``'s ``--model-id`` then defaults to the name as given, so clients
    say ``Qwen/Qwen3-0.6B`` rather than a snapshot's commit hash.
    """
    if getattr(args, "model", None) is None:
        return
    resolved = resolve_model(args.model)
    if resolved.model_id is not None and getattr(args, "model_id", "absent") is None:
        args.model_id = resolved.model_id
    args.model = str(resolved.path)
    args.repo_mmproj = str(resolved.mmproj) if resolved.mmproj is not None else None  # --mmproj's candidate


def _pull(name: str) -> int:
    resolved = resolve_model(name)
    if resolved.source == "local":
        print(f"kestrel-trio: {name} is a local path: nothing to pull", file=sys.stderr)
    elif resolved.downloaded:
        print(f"kestrel-trio: pulled {name} ({format_bytes(resolved.downloaded)} downloaded)", file=sys.stderr)
    else:
        print(f"kestrel-trio: {name} is already cached: nothing downloaded", file=sys.stderr)
    print(resolved.path)
    return 0


def _hub_cache() -> Path:
    return HubSettings.from_environment().cache_dir


def _list() -> int:
    rows = cached_models(_hub_cache(), kestrel_cache_dir())
    if not rows:
        print(f"no models cached (looked in {_hub_cache()} and {kestrel_cache_dir()})", file=sys.stderr)
        return 0
    table = [("ID", "FORMAT", "SIZE", "PATH")] + [(r.id, r.format, format_bytes(r.size), str(r.path)) for r in rows]
    widths = [max(len(row[column]) for row in table) for column in range(3)]
    for row in table:
        print(f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:>{widths[2]}}  {row[3]}")
    return 0


def _rm(name: str) -> int:
    freed = remove_model(name, _hub_cache(), kestrel_cache_dir())
    print(f"removed {name} ({format_bytes(freed)} freed)")
    return 0
