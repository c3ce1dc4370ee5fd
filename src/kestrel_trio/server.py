"""``serve``: the HTTP server, the engine and the model, as one trio task.

Theory of operation: ``serve`` binds the socket first, so /health answers
(503, "loading") while the weights load in a worker thread; then it starts
the engine and calls ``task_status.started(server)``. It runs until cancelled
or until :meth:`Server.shutdown` is called. A graceful shutdown marks the
server "draining" (/health 503, so balancers stop sending) and keeps serving
new requests for ``drain_delay`` seconds, so a balancer's health check can
notice before connections are refused; then it stops accepting connections,
lets running requests finish for ``grace`` seconds, then ends
the remaining generations (streams get an error event and ``[DONE]``), waits
for the HTTP layer to close its connections, and stops the engine.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Iterable

import attrs
import trio

from kestrel_trio.engine import Engine, EngineLimits, run_engine
from kestrel_trio.errors import KestrelError
from kestrel_trio.http import HttpLimits, HttpServer, serve_http
from kestrel_trio.model import (
    DEMO_MODEL_ID, Model, is_qwen3_vl_folder, load_demo_model, load_model, set_blas_threads,
)
from kestrel_trio.routes import ServerState, build_router
from kestrel_trio.routes_images import ImagePolicy

__all__ = ["Server", "serve"]

log = logging.getLogger("kestrel_trio.server")

# Seconds after ``grace`` at which the HTTP layer's own hard stop comes, so streams can send their final
# events first. A supervisor's stop timeout must exceed drain_delay + grace + this (docs/deployment.md).
HTTP_GRACE_MARGIN = 5.0


@attrs.define(eq=False)
class Server:
    """A running server, as handed to ``task_status.started``.

    Attributes:
        host: the bound address.
        port: the bound TCP port (the real one when 0 was asked for).
        state: what /health reports and the routes read.
        engine: the inference engine.
        http: the HTTP layer's handle.
    """

    host: str
    port: int
    state: ServerState
    engine: Engine
    http: HttpServer
    _shutdown: trio.Event = attrs.field(factory=trio.Event)

    @property
    def url(self) -> str:
        """The base URL of the OpenAI API, e.g. ``http://127.0.0.1:8000/v1``."""
        return f"http://{self.host}:{self.port}/v1"

    def shutdown(self) -> None:
        """Begin a graceful shutdown; ``serve`` returns when it is complete."""
        self._shutdown.set()


def _resolve_model_id(model: Model | str | Path | None, model_id: str | None) -> str:
    if model_id:
        return model_id
    if isinstance(model, Model):
        return model.name
    if model is None:
        return DEMO_MODEL_ID
    return Path(model).resolve().name


def _accepts_images(model: Model | str | Path | None) -> bool:
    if isinstance(model, Model):
        return model.vision is not None
    return model is not None and is_qwen3_vl_folder(Path(model))


def _image_policy(policy: ImagePolicy, allow_image_dir: str | Path | None) -> ImagePolicy:
    if allow_image_dir is None:
        return policy
    if not Path(allow_image_dir).is_dir():
        raise KestrelError(f"allow_image_dir {str(allow_image_dir)!r} is not a folder")
    return attrs.evolve(policy, allow_dir=allow_image_dir)


def _room_for_images(limits: HttpLimits, policy: ImagePolicy) -> HttpLimits:
    """HTTP limits whose body bound fits ``max_images`` base64 images of ``max_bytes`` each, plus 1 MiB of text."""
    needed = policy.max_images * (-(-policy.max_bytes // 3) * 4) + 2**20
    return limits if limits.max_body_bytes >= needed else attrs.evolve(limits, max_body_bytes=needed)


def _load(model: str | Path | None, weights: str) -> Model:
    if model is None:
        log.warning("no --model given: serving the built-in demo model %r; its weights are random and its text "
                    "is meaningless", DEMO_MODEL_ID)
        return load_demo_model()
    loaded = load_model(model, weights=weights)
    log.info("weights in memory as %s (asked for %s)", loaded.weights_mode, weights)
    return loaded


async def serve(
    model: Model | str | Path | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    model_id: str | None = None,
    api_key: str | None = None,
    open_paths: Iterable[str] = ("/health", "/metrics"),
    weights: str = "auto",
    blas_threads: int | None = None,
    engine_limits: EngineLimits = EngineLimits(),
    http_limits: HttpLimits = HttpLimits(),
    grace: float = 10.0,
    drain_delay: float = 0.0,
    image_policy: ImagePolicy = ImagePolicy(),
    allow_image_dir: str | Path | None = None,
    task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the OpenAI-compatible API until cancelled or shut down.

    Use as ``server = await nursery.start(serve, model)``; ``started`` is called
    with a :class:`Server` once the socket is bound and the model is ready.

    Args:
        model: a loaded :class:`Model`, a checkpoint folder, or None for the built-in demo model.
        host: the address to bind (loopback by default).
        port: the TCP port; 0 picks a free one (see ``Server.port``).
        model_id: the id clients use; defaults to the checkpoint folder's name.
        api_key: require ``Authorization: Bearer <api_key>`` on every route but ``open_paths``.
        open_paths: the exact paths that never need the API key (probes for balancers and Prometheus).
        weights: "auto", "bf16" or "fp32": how a checkpoint folder's weights stay in memory (see load_model).
        blas_threads: threads numpy's BLAS may use, process-wide (None: one per core).
        engine_limits: queue and batch bounds.
        http_limits: HTTP deadlines (seconds) and size limits (bytes).
        grace: seconds running requests may take to finish once the listener is closed.
        drain_delay: seconds between the start of a shutdown (/health turns 503 "draining")
            and the listener's close; requests arriving meanwhile are still served.
        image_policy: image limits of chat requests (Qwen3-VL models only).
        allow_image_dir: a folder whose files ``file://`` image URLs may name
            (overrides ``image_policy.allow_dir``); by default none may.

    A Qwen3-VL model raises ``http_limits.max_body_bytes`` when needed so that
    a request can carry ``max_images`` base64 images of ``max_bytes`` each.
    """
    policy = _image_policy(image_policy, allow_image_dir)
    state = ServerState(model_id=_resolve_model_id(model, model_id), api_key=api_key, images=policy,
                        open_paths=frozenset(open_paths))
    http_limits = attrs.evolve(http_limits, shutdown_grace=grace + HTTP_GRACE_MARGIN)
    if _accepts_images(model):
        http_limits = _room_for_images(http_limits, policy)
    async with trio.open_nursery() as nursery:
        http_done = trio.Event()

        async def run_http(*, task_status: trio.TaskStatus) -> None:
            try:
                await serve_http(build_router(state), host=host, port=port, limits=http_limits, task_status=task_status)
            finally:
                http_done.set()

        http: HttpServer = await nursery.start(run_http)
        state.http = http
        log.info("listening on http://%s:%d (model %s loading)", http.host, http.port, state.model_id)
        if blas_threads is not None:
            set_blas_threads(blas_threads)
        loaded = model if isinstance(model, Model) else await trio.to_thread.run_sync(_load, model, weights)
        engine: Engine = await nursery.start(functools.partial(run_engine, loaded, limits=engine_limits))
        state.model, state.engine, state.status = engine.model, engine, "ok"  # the model as served (context cap)
        server = Server(host=http.host, port=http.port, state=state, engine=engine, http=http)
        log.info("ready: model %s at %s", state.model_id, server.url)
        task_status.started(server)
        await server._shutdown.wait()
        await _drain(state, http, http_done, grace, drain_delay)
        nursery.cancel_scope.cancel()


async def _drain(state: ServerState, http: HttpServer, http_done: trio.Event, grace: float, drain_delay: float) -> None:
    state.status = "draining"
    if drain_delay > 0:
        log.info("shutting down: /health reports draining; still serving for %.1f s", drain_delay)
        await trio.sleep(drain_delay)
    log.info("shutting down: listener closed; running requests get up to %.1f s", grace)
    http.begin_shutdown()
    with trio.move_on_after(grace):
        await http_done.wait()
    state.end_streams()
    await http_done.wait()
    log.info("shutdown complete")
