"""What the routes read: the served model, the engine, the lifecycle status, and the request limits."""

from __future__ import annotations

import time

import attrs
import trio

from kestrel_trio.app.media.images import ImagePolicy
from kestrel_trio.app.media.videos import VideoPolicy
from kestrel_trio.engine import Engine
from kestrel_trio.engine.memory.host_memory import process_memory
from kestrel_trio.http import HttpServer
from kestrel_trio.model import Model
from kestrel_trio.text.sampling import SamplingDefaults

__all__ = ["ServerState", "OPEN_PATHS"]

OPEN_PATHS = frozenset({"/health", "/metrics"})  # the paths that need no API key unless told otherwise


@attrs.define
class ServerState:
    """What the routes read: the model and engine once ready, and the lifecycle status.

    Attributes:
        model_id: the id clients use (known before the weights load).
        status: "loading", "ok", "draining" or "broken".
        model: the loaded model, or None while loading.
        engine: the running engine, or None while loading.
        http: the HTTP server, once its socket is bound (its metrics are on /metrics).
        api_key: if set, every route except ``open_paths`` needs ``Authorization: Bearer <key>``.
        open_paths: routes that never need the key.
        default_max_tokens: the server-wide cap on new tokens for requests that set no
            ``max_tokens`` (see :func:`kestrel_trio.openai.default_max_tokens`); None: OpenAI's defaults.
        sampling: the server's sampling defaults (``serve --temperature`` ...), under each request's own fields.
        reasoning: the reasoning of a chat request that asks for none: "auto" (the model's own), "on" or "off"
            (``serve --reasoning``; :mod:`kestrel_trio.app.chat.thinking`).
        images: what image input chat requests may carry (Qwen3-VL models only).
        image_workers: requests whose images or videos are being decoded at once (worker threads).
        videos: what video input chat requests may carry (Qwen3-VL models only).
        text_workers: requests whose prompt is being rendered and tokenized at once (worker
            threads, so a megabyte prompt never stalls the event loop and /health).
        text_calls: when (trio clock, s) each template render, tokenization or grammar compile now in a text
            worker started; one running past ``text_stall_seconds`` makes /health say "stalled" (503).
        text_stall_seconds: how long one text-worker call may run before /health counts it stuck (a template's
            own render deadline is 10 s; a tokenization or compile of a prompt that fits takes well under one).
        accepts_images: the model takes images (Qwen3-VL); /v1/models says so.
        accepts_videos: the model takes video files (Qwen3-VL with PyAV installed); /v1/models says so.
        webui: serve the built-in chat page at ``/``.
    """

    model_id: str
    status: str = "loading"
    model: Model | None = None
    engine: Engine | None = None
    http: HttpServer | None = None
    api_key: str | None = None
    open_paths: frozenset[str] = OPEN_PATHS
    default_max_tokens: int | None = None
    sampling: SamplingDefaults = SamplingDefaults()
    reasoning: str = "auto"
    images: ImagePolicy = ImagePolicy()
    videos: VideoPolicy = VideoPolicy()
    image_workers: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(1))
    text_workers: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(2))
    text_calls: dict = attrs.field(factory=dict)
    text_stall_seconds: float = 60.0
    accepts_images: bool = False
    accepts_videos: bool = False
    webui: bool = False
    created: int = attrs.field(factory=lambda: int(time.time()))

    def health(self) -> tuple[int, dict]:
        """The /health status code and body, from counters only (never waits)."""
        engine = self.engine
        status = self.status
        if status == "ok" and engine is not None:
            if engine.status != "ok":
                status = "broken"
            elif engine.stalled():
                status = "stalled"
        longest = max((trio.current_time() - started for started in self.text_calls.values()), default=0.0)
        if status == "ok" and longest > self.text_stall_seconds:
            status = "stalled"
        body: dict = {"status": status, "model": self.model_id}
        if self.model is not None:
            body["weights"] = self.model.weights_mode
            body.update(self.model.kernel_report())  # "cpu" and "products": which kernels run, for bug reports
        if engine is not None:
            body.update(engine.report())
        else:
            body.update(busy=False, queued=0, active=0, batch=0)
        body["text_workers"] = {"busy": len(self.text_calls), "longest_seconds": round(longest, 3)}
        body["memory"] = process_memory()  # the whole process: weights, KV, step temporaries, the interpreter
        return (200 if status == "ok" else 503), body
