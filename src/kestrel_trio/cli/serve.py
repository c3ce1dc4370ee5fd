"""``kestrel-trio serve``: the server started under ``trio.run``, its signals, and a clean exit.

With the CLI's other modules, the only place that calls ``trio.run``.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import sys
from typing import NoReturn

if sys.version_info < (3, 11):  # trio depends on the backport there
    from exceptiongroup import BaseExceptionGroup

from kestrel_trio.app import ImagePolicy, VideoPolicy
from kestrel_trio.app.state import OPEN_PATHS
from kestrel_trio.cli.flags import quantized_cache, sampling_defaults
from kestrel_trio.engine import EngineLimits
from kestrel_trio.errors import KestrelError
from kestrel_trio.http import HttpLimits
from kestrel_trio.model import CheckedModel

__all__ = ["serve_command"]

log = logging.getLogger("kestrel_trio.cli")


def _host_names(values: list[str] | None) -> list[str] | None:
    """--host-allowlist's values, comma-separated ones split; None when the flag was not given."""
    return None if values is None else [name.strip() for value in values for name in value.split(",") if name.strip()]


def serve_command(args: argparse.Namespace, model: CheckedModel | None, draft: CheckedModel | None) -> NoReturn:
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
        max_connections_per_client=args.max_connections_per_client, max_header_bytes=args.max_header_bytes,
        max_body_bytes=args.max_body_bytes,
    )
    _raise_open_files_limit(args.max_connections + _SPARE_FILES)
    open_paths = args.open_paths if args.open_paths is not None else OPEN_PATHS
    progress = None
    if args.model is not None:
        from kestrel_trio.cli.progress import LoadProgress, checkpoint_bytes

        progress = LoadProgress("loading weights", total_bytes=checkpoint_bytes(args.model, args.mmproj))
    start = functools.partial(
        serve, model, host=args.host, port=args.port, model_id=args.model_id, api_key=args.api_key,
        open_paths=open_paths, weights=args.weights, quantized_cache=quantized_cache(args),
        blas_threads=args.blas_threads, engine_limits=engine_limits,
        http_limits=http_limits, grace=args.grace, drain_delay=args.drain_delay,
        image_policy=ImagePolicy(max_bytes=args.max_image_bytes, max_pixels=args.max_image_pixels,
                                 max_images=args.max_images),
        video_policy=VideoPolicy(fps=args.video_fps, max_frames=args.max_video_frames, max_bytes=args.max_video_bytes,
                                 max_pixels=args.max_video_pixels, max_videos=args.max_videos),
        allow_image_dir=args.allow_image_dir, default_max_tokens=args.default_max_tokens,
        sampling_defaults=sampling_defaults(args), reasoning=args.reasoning,
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
        from kestrel_trio.cli.errors import report

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
