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
import gc
import logging
import sys
from pathlib import Path
from typing import Callable, Iterable

import attrs
import trio

from kestrel_trio.engine import Engine, EngineLimits, run_engine
from kestrel_trio.errors import EngineUnavailableError, KestrelError, ModelLoadError
from kestrel_trio.http import (CorsPolicy, HostAllowlist, HttpLimits, HttpServer, default_host_allowlist,
                               serve_http)
from kestrel_trio.model import (
    DEMO_MODEL_ID, CheckedModel, Model, check_context_cap, check_draft_model, check_model, load_demo_model,
    load_model, set_blas_threads, set_prefill_precision, set_products,
)
from kestrel_trio.app import OPEN_PATHS, ImagePolicy, ServerState, VideoPolicy, build_router
from kestrel_trio.app.chat.thinking import check_reasoning_default
from kestrel_trio.text.sampling import SamplingDefaults
from kestrel_trio.webui import PATHS as WEBUI_PATHS

__all__ = ["Server", "serve"]

log = logging.getLogger("kestrel_trio.server")

# How long (s) a thread wanting the GIL waits before it asks the holder to let go (CPython's default: 5 ms). The
# event loop waits up to that long at every wake-up while a text worker renders a template or parses a body (pure
# Python), and one /health answer takes several wake-ups. On a 2-core EPYC (Zen 5) at load 13, /health during a
# 60,000-turn chat waited a median 25 ms and p90 47 ms at 5 ms, 16 ms and 32 ms at 1 ms (5 and 10 ms when idle);
# decode speed did not change (demo model, 128 streamed tokens, within the runs' spread).
LOOP_SWITCH_SECONDS = 0.001

# A chat request that sets no max_tokens stops here: OpenAI's API runs to the end of the context, and a small or
# greedy model that falls into a loop then writes for minutes (8,192 tokens of SmolLM2 on a 2-core board). 1,024
# tokens hold a long answer (about 700 English words); a reasoning model may need more (--default-max-tokens).
DEFAULT_CHAT_MAX_TOKENS = 1024
# The demo model's random weights never emit an end token: a few hundred tokens take seconds.
DEMO_DEFAULT_MAX_TOKENS = 256

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

    def end_generations(self) -> None:
        """End every generation now, as a shutdown does once its grace is over: streams get an error event
        and ``[DONE]``, other requests 503."""
        self.engine.end_generations(
            EngineUnavailableError("the server is shutting down; this generation was stopped", retry_after=5))


# What serve holds of its model before the load: a loaded Model, a checked checkpoint, or None for the demo.
Source = Model | CheckedModel | None


def _checked(model: Model | CheckedModel | str | Path | None, weights: str, what: str,
             mmproj: str | Path | None = None) -> Source:
    """``model`` checked (a path parsed once here, for the load too; a checked model's ``weights`` compared)."""
    if isinstance(model, (str, Path)):
        return check_model(model, weights=weights, mmproj=mmproj)
    if isinstance(model, CheckedModel):
        model.residency_for(weights)  # raises when it was checked for other weights
    elif model is not None and not isinstance(model, Model):
        raise KestrelError(f"{what} must be a Model, a checkpoint path or None, got {type(model).__name__}")
    return model


def _resolve_model_id(model: Source, model_id: str | None) -> str:
    if model_id:
        return model_id
    if model is None:
        return DEMO_MODEL_ID
    return model.name  # a GGUF file's stem (a hub cache's symlink keeps its own name) or the folder's name


def _is_demo(model: Source) -> bool:
    return model is None or (isinstance(model, Model) and model.is_demo)


def _accepts_images(model: Source) -> bool:
    if isinstance(model, Model):
        return model.vision is not None
    return model is not None and model.vision


def _accepts_videos(model: Source) -> bool:
    """Video files need the model's vision tower and PyAV (frame lists need Pillow only)."""
    if not _accepts_images(model):
        return False
    try:
        import av  # noqa: F401  (the optional ``video`` extra)
    except ImportError:
        return False
    return True


def _check_loaded_backend(model: Model, **settings: str | int | None) -> None:
    """Refuse a kernel setting that differs from an already loaded ``model``'s: a model keeps the settings it was
    loaded with, so the server would otherwise ignore it."""
    backend = model.decoder.backend
    for name, value in settings.items():
        held = getattr(backend, "thread_count" if name == "blas_threads" else name)
        if value is not None and value != held:
            raise ModelLoadError(f"{name}={value!r}: the model was loaded with {name}={held!r}; "
                                 f"give it to load_model, or pass a model path")


def _image_policy(policy: ImagePolicy, allow_image_dir: str | Path | None) -> ImagePolicy:
    if allow_image_dir is None:
        return policy
    if not Path(allow_image_dir).is_dir():
        raise KestrelError(f"allow_image_dir {str(allow_image_dir)!r} is not a folder")
    return attrs.evolve(policy, allow_dir=allow_image_dir)


def _cors_policy(origins: Iterable[str]) -> CorsPolicy:
    try:
        return CorsPolicy(origins)
    except (TypeError, ValueError) as exc:
        raise KestrelError(f"cors_origins: {exc}") from None


def _room_for_images(limits: HttpLimits, policy: ImagePolicy, videos: VideoPolicy | None = None) -> HttpLimits:
    """HTTP limits whose body bound fits ``max_images`` base64 images of ``max_bytes`` each (and ``max_videos``
    base64 videos), plus 1 MiB of text."""
    needed = policy.max_images * (-(-policy.max_bytes // 3) * 4) + 2**20
    if videos is not None:
        needed += videos.max_videos * (-(-videos.max_bytes // 3) * 4)
    return limits if limits.max_body_bytes >= needed else attrs.evolve(limits, max_body_bytes=needed)


def _default_max_tokens(cap: int | None, model: Source) -> int | None:
    """The server's cap for requests without ``max_tokens`` (None: up to the context) from ``serve``'s argument."""
    if cap is None:
        return DEMO_DEFAULT_MAX_TOKENS if _is_demo(model) else DEFAULT_CHAT_MAX_TOKENS
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
        raise KestrelError(f"default_max_tokens must be a count of tokens (0 for no cap), got {cap!r}")
    return cap or None


def _load(model: CheckedModel | None, weights: str, progress: Callable[[float], None] | None,
          quantized_cache: str | Path | bool = True) -> Model:
    if model is None:
        log.warning("no --model given: serving the built-in demo model %r; its weights are random and its text "
                    "is meaningless", DEMO_MODEL_ID)
        return load_demo_model()
    loaded = load_model(model, weights=weights, progress=progress, quantized_cache=quantized_cache)
    log.info("weights in memory as %s (asked for %s)", loaded.weights_mode, weights)
    return loaded


def _speculative_limits(limits: EngineLimits, model: Source, draft_model: Model | CheckedModel | str | Path | None,
                        weights: str) -> tuple[EngineLimits, Source]:
    """``limits`` with the speculative mode a draft model implies, and the draft checked (against the model too;
    no weights read)."""
    if draft_model is None:
        if limits.speculative == "draft":
            raise KestrelError("speculative decoding 'draft' needs a draft model (draft_model, --draft-model)")
        return limits, None
    if limits.speculative == "ngram":
        raise KestrelError("a draft model was given with speculative decoding 'ngram': choose one "
                           "(--draft-model implies --speculative draft)")
    draft = _checked(draft_model, weights, "draft_model")
    check_draft_model(model, draft)
    return attrs.evolve(limits, speculative="draft"), draft


def _load_draft(draft_model: Source, weights: str, quantized_cache: str | Path | bool) -> Model | None:
    if draft_model is None or isinstance(draft_model, Model):
        return draft_model
    loaded = load_model(draft_model, weights=weights, quantized_cache=quantized_cache)
    log.info("draft model %s: weights in memory as %s", loaded.name, loaded.weights_mode)
    return loaded


def _host_allowlist(names: Iterable[str] | None, host: str, api_key: str | None) -> HostAllowlist | None:
    if names is None:
        return default_host_allowlist(host, bool(api_key))
    names = list(names)
    return None if "*" in names else HostAllowlist.of(names)


async def serve(
    model: Model | CheckedModel | str | Path | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    model_id: str | None = None,
    api_key: str | None = None,
    open_paths: Iterable[str] = OPEN_PATHS,
    weights: str = "auto",
    quantized_cache: str | Path | bool = True,
    blas_threads: int | None = None,
    prefill_precision: str | None = None,
    products: str | None = None,
    engine_limits: EngineLimits = EngineLimits(),
    http_limits: HttpLimits = HttpLimits(),
    grace: float = 10.0,
    drain_delay: float = 0.0,
    image_policy: ImagePolicy = ImagePolicy(),
    video_policy: VideoPolicy = VideoPolicy(),
    allow_image_dir: str | Path | None = None,
    default_max_tokens: int | None = None,
    sampling_defaults: SamplingDefaults = SamplingDefaults(),
    reasoning: str = "auto",
    cors_origins: Iterable[str] = (),
    host_allowlist: Iterable[str] | None = None,
    webui: bool = True,
    progress: Callable[[float], None] | None = None,
    draft_model: Model | CheckedModel | str | Path | None = None,
    mmproj: str | Path | None = None,
    task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the OpenAI-compatible API until cancelled or shut down.

    Use as ``server = await nursery.start(serve, model)``; ``started`` is called
    with a :class:`Server` once the socket is bound and the model is ready.
    Just before, ``gc.freeze()`` moves every object alive then into the
    collector's permanent generation (the process's own too, if embedded):
    full collections, which hold the GIL, then scan only what came later.
    The GIL's switch interval is also cut to :data:`LOOP_SWITCH_SECONDS`
    (process-wide, unless already shorter), so the event loop waits less for
    the GIL while worker threads run Python.

    Args:
        model: a loaded :class:`Model`, a checkpoint folder or GGUF file (or one that
            :func:`kestrel_trio.model.check_model` checked, with the same ``weights``: not parsed again), or None
            for the built-in demo model.
        host: the address to bind (loopback by default).
        port: the TCP port; 0 picks a free one (see ``Server.port``).
        model_id: the id clients use; defaults to the checkpoint folder's name.
        api_key: require ``Authorization: Bearer <api_key>`` on every route but ``open_paths``.
        open_paths: the exact paths that never need the API key (probes for balancers and Prometheus).
        weights: "auto", "fp32", "bf16", "int8", "int4" or "gguf": how the weights stay in memory (see load_model).
        quantized_cache: where int8/int4 weights are cached (True: the default folder; False: no cache; see load_model).
        blas_threads: threads numpy's BLAS may use, process-wide, and that share each product of the models
            loaded here (None: one per core).
        prefill_precision: "fp32" or "bf16" (AMX tiles), of the models loaded here (None: as set, at first
            "fp32"; see kestrel_trio.model.set_prefill_precision). A ``model`` already loaded keeps its own: a
            different one is refused.
        products: "auto", "exact" or "integer": the products of quantized weights of the models loaded here
            (None: as set, at first "auto": integer on aarch64; see kestrel_trio.model.set_products). A
            ``model`` already loaded keeps its own (and its ``blas_threads``): a different one is refused.
        engine_limits: queue and batch bounds.
        http_limits: HTTP deadlines (seconds) and size limits (bytes).
        grace: seconds running requests may take to finish once the listener is closed.
        drain_delay: seconds between the start of a shutdown (/health turns 503 "draining")
            and the listener's close; requests arriving meanwhile are still served.
        image_policy: image limits of chat requests (Qwen3-VL models only).
        video_policy: video limits and sampling rate of chat requests (Qwen3-VL models only; video files
            also need PyAV, the ``video`` extra).
        allow_image_dir: a folder whose files ``file://`` image URLs may name
            (overrides ``image_policy.allow_dir``); by default none may.
        default_max_tokens: the most new tokens (a count of tokens) of a request that sets no
            ``max_tokens`` (like llama.cpp's ``-n``): chat generates up to it instead of up to the
            context; completions keep OpenAI's 16 unless it is lower. None:
            :data:`DEFAULT_CHAT_MAX_TOKENS` (1,024), :data:`DEMO_DEFAULT_MAX_TOKENS` on the demo
            model. 0: no cap, OpenAI's behaviour (chat runs to the end of the context).
        sampling_defaults: the server's defaults for ``temperature``, ``top_p``, ``top_k``, ``min_p``,
            ``repetition_penalty`` and the repetition guard (ranges and units in
            :class:`~kestrel_trio.text.sampling.SamplingDefaults`): each applies to a request that
            leaves the field out, over the model's own defaults (its generation_config.json, or a
            named model's publisher's); by default none.
        reasoning: whether a chat request that does not say gets reasoning: "auto" (the model's chat
            template decides; Qwen3 reasons), "on" or "off" (carried out per model as
            :mod:`kestrel_trio.app.chat.thinking` says; a model without reasoning answers as always).
        cors_origins: origins (``scheme://host[:port]``, or ``*`` for any) whose web
            pages may call the API from a browser; by default none. The API key
            still applies to their requests; CORS preflights need none.
        host_allowlist: the ``Host`` header names answered (``name`` or ``name:port``; ``*``: any); others
            get 403, against DNS rebinding. None: when ``host`` is loopback and no ``api_key`` is set, the
            loopback names and ``host``; otherwise any.
        webui: serve the built-in chat page at ``/`` (its files need no API key).
        progress: called with the fraction of weight bytes read (0 to 1) while a
            checkpoint folder loads, from the loading worker thread.
        draft_model: a small model with the same vocabulary (a loaded Model, a checkpoint path or a checked one)
            that drafts tokens for speculative decoding at batch 1; implies
            ``engine_limits.speculative == "draft"``. Loaded with the same ``weights`` after the model.
        mmproj: the vision tower of a Qwen3-VL language-model GGUF ``model``: llama.cpp's ``mmproj``
            GGUF file (see load_model). Both headers are checked to fit each other before the socket is bound.

    Raises:
        ModelLoadError: ``model`` (or ``draft_model``) is not a checkpoint folder or its config.json is
            refused, or the draft's vocabulary differs from the model's (checked before the socket
            is bound), or its weights fail to load.
        KestrelError: ``engine_limits.speculative`` and ``draft_model`` disagree,
            ``engine_limits.max_model_len`` exceeds the model's context (both checked before the socket is bound),
            ``default_max_tokens`` is negative, or ``reasoning`` is not a mode.
        OSError: the socket cannot be bound (e.g. the port is in use); the message
            names the address.

    A Qwen3-VL model raises ``http_limits.max_body_bytes`` when needed so that
    a request can carry ``max_images`` base64 images of ``max_bytes`` each.
    """
    if mmproj is not None and (model is None or isinstance(model, (Model, CheckedModel))):
        raise ModelLoadError("mmproj goes with a GGUF language model file (model), which was not given"
                             if model is None else "mmproj goes with a model path, not an already loaded or "
                                                   "checked Model")
    model = _checked(model, weights, "model", mmproj)  # a wrong path fails now, before anything listens or loads
    check_context_cap(model, engine_limits.max_model_len)  # so does a cap the config cannot hold
    engine_limits, draft_model = _speculative_limits(engine_limits, model, draft_model, weights)
    policy = _image_policy(image_policy, allow_image_dir)
    if isinstance(model, Model):  # before the defaults change: a refusal leaves them as they were
        _check_loaded_backend(model, products=products, prefill_precision=prefill_precision,
                              blas_threads=blas_threads)
    if products is not None:
        set_products(products)  # an unknown mode fails now, before anything listens or loads
    default_max_tokens = _default_max_tokens(default_max_tokens, model)
    if not isinstance(sampling_defaults, SamplingDefaults):
        raise KestrelError(f"sampling_defaults must be a SamplingDefaults, got {sampling_defaults!r}")
    check_reasoning_default(reasoning)
    cors = _cors_policy(cors_origins)
    open_paths = frozenset(open_paths) | (WEBUI_PATHS if webui else frozenset())
    state = ServerState(model_id=_resolve_model_id(model, model_id), api_key=api_key, images=policy,
                        open_paths=open_paths, accepts_images=_accepts_images(model), webui=webui,
                        videos=video_policy, accepts_videos=_accepts_videos(model),
                        default_max_tokens=default_max_tokens, sampling=sampling_defaults, reasoning=reasoning)
    http_limits = attrs.evolve(http_limits, shutdown_grace=grace + HTTP_GRACE_MARGIN)
    if _accepts_images(model):
        http_limits = _room_for_images(http_limits, policy, video_policy if _accepts_videos(model) else None)
    async with trio.open_nursery() as nursery:
        http_done = trio.Event()

        async def run_http(*, task_status: trio.TaskStatus) -> None:
            try:
                await serve_http(build_router(state), host=host, port=port, limits=http_limits, cors=cors,
                                 hosts=_host_allowlist(host_allowlist, host, api_key), task_status=task_status)
            finally:
                http_done.set()

        http: HttpServer = await _listen(nursery, run_http, host, port)
        state.http = http
        log.info("listening on http://%s:%d (model %s loading)", http.host, http.port, state.model_id)
        if blas_threads is not None:
            set_blas_threads(blas_threads)
        if prefill_precision is not None:
            set_prefill_precision(prefill_precision)
        loaded = model if isinstance(model, Model) else await trio.to_thread.run_sync(
            _load, model, weights, progress, quantized_cache)
        draft = await trio.to_thread.run_sync(_load_draft, draft_model, weights, quantized_cache)
        engine: Engine = await nursery.start(functools.partial(run_engine, loaded, limits=engine_limits,
                                                               draft_model=draft))
        state.model, state.engine, state.status = engine.model, engine, "ok"  # the model as served (context cap)
        server = Server(host=http.host, port=http.port, state=state, engine=engine, http=http)
        spec = engine.speculation
        if spec.mode != "off":
            log.info("speculative decoding: %s, %d tokens a draft%s", spec.mode, spec.tokens,
                     f" (draft model {spec.draft_model.name})" if spec.draft_model is not None else "")
        log.info("ready: model %s at %s", state.model_id, server.url)
        # What start-up made (numba's and LLVM's objects, the tokenizer's, the model's) is never garbage: moved
        # out of the cyclic collector's reach, it is not scanned again by every full collection, each of which
        # holds the GIL. Measured on the 2-core Zen 3: a full collection of a loaded demo server took 118 ms
        # (124,000 objects), and a 60,000-turn chat being parsed set off several, the event loop (and /health)
        # waiting 0.3-0.4 s.
        gc.freeze()
        sys.setswitchinterval(min(sys.getswitchinterval(), LOOP_SWITCH_SECONDS))
        task_status.started(server)
        await server._shutdown.wait()
        await _drain(server, http_done, grace, drain_delay)
        nursery.cancel_scope.cancel()


async def _listen(nursery: trio.Nursery, run_http, host: str, port: int) -> HttpServer:
    """Start the HTTP layer; a bind failure names the address (the socket's own message does not)."""
    try:
        return await nursery.start(run_http)
    except OSError as exc:
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        message = f"cannot listen on {address}: {exc.strerror or exc}"
        raise (OSError(exc.errno, message) if exc.errno is not None else OSError(message)) from exc


async def _drain(server: Server, http_done: trio.Event, grace: float, drain_delay: float) -> None:
    server.state.status = "draining"
    if drain_delay > 0:
        log.info("shutting down: /health reports draining; still serving for %.1f s", drain_delay)
        await trio.sleep(drain_delay)
    log.info("shutting down: listener closed; running requests get up to %.1f s", grace)
    server.http.begin_shutdown()
    with trio.move_on_after(grace):
        await http_done.wait()
    server.end_generations()
    await http_done.wait()
    log.info("shutdown complete")
