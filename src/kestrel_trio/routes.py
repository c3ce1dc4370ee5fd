"""The OpenAI-compatible routes: HTTP requests in, engine generations, JSON or SSE out.

This module joins the HTTP layer, the OpenAI schema layer and the engine. It
does all validation (JSON, fields, template, context length, queue room)
before a response head is sent, so every refusal is a proper HTTP status with
the OpenAI error envelope; once an SSE stream has started, a failure is sent
as an ``error`` event followed by ``[DONE]``.
"""

from __future__ import annotations

import functools
import hmac
import logging
import time

import attrs
import trio

from kestrel_trio import openai as oa
from kestrel_trio.engine import Engine, GenerationHandle
from kestrel_trio.errors import BadRequestError, EngineUnavailableError, KestrelError
from kestrel_trio.http import HttpServer, Request, Response, Router, StreamingResponse
from kestrel_trio.model import Model
from kestrel_trio.routes_chat import ChatOptions, Job
from kestrel_trio.routes_images import ImagePolicy, prepare_images, template_parts
from kestrel_trio.text.images import expand_image_pads
from kestrel_trio.stats import CONTENT_TYPE as PROMETHEUS_CONTENT_TYPE

__all__ = ["ServerState", "build_router"]

log = logging.getLogger("kestrel_trio.server")

# What Qwen3's template renders for enable_thinking=False: an empty, closed reasoning block.
_NO_THINKING = "<think>\n\n</think>\n\n"


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
        images: what image input chat requests may carry (Qwen3-VL models only).
        image_workers: requests whose images are being decoded at once (worker threads).
        text_workers: requests whose prompt is being rendered and tokenized at once (worker
            threads, so a megabyte prompt never stalls the event loop and /health).
    """

    model_id: str
    status: str = "loading"
    model: Model | None = None
    engine: Engine | None = None
    http: HttpServer | None = None
    api_key: str | None = None
    open_paths: frozenset[str] = frozenset({"/health", "/metrics"})
    images: ImagePolicy = ImagePolicy()
    image_workers: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(1))
    text_workers: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(2))
    created: int = attrs.field(factory=lambda: int(time.time()))
    streams_ended: bool = False
    _waits: set = attrs.field(factory=set)

    def end_streams(self) -> None:
        """Stop every generation still being awaited: streams end with an error event, others with 503."""
        self.streams_ended = True
        for scope in list(self._waits):
            scope.cancel()

    async def next_delta(self, handle: GenerationHandle):
        """The next delta of ``handle``, or EngineUnavailableError once :meth:`end_streams` was called."""
        if not self.streams_ended:
            # The scope covers only this wait (never a yield), so cancelling it is safe in a generator.
            with trio.CancelScope() as scope:
                self._waits.add(scope)
                try:
                    return await handle.__anext__()
                finally:
                    self._waits.discard(scope)
        raise EngineUnavailableError("the server is shutting down; this generation was stopped", retry_after=5)

    def health(self) -> tuple[int, dict]:
        """The /health status code and body, from counters only (never waits)."""
        engine = self.engine
        status = self.status
        if status == "ok" and engine is not None:
            if engine.status != "ok":
                status = "broken"
            elif engine.stalled():
                status = "stalled"
        body: dict = {"status": status, "model": self.model_id}
        if self.model is not None:
            body["weights"] = self.model.weights_mode
        if engine is not None:
            body.update(busy=engine.busy, queued=engine.queued, active=engine.active, batch=engine.batch_in_flight,
                        max_queued=engine.limits.max_queued, max_batch=engine.limits.max_batch)
            body.update(engine.memory_report())
        else:
            body.update(busy=False, queued=0, active=0, batch=0)
        return (200 if status == "ok" else 503), body


def _json(status: int, obj: object, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(status=status, body=oa.to_json_bytes(obj), headers=headers)


def build_router(state: ServerState) -> "_AuthorizingHandler":
    """The request handler: the routes, behind the API-key check."""
    router = Router()
    routes = _Routes(state)
    router.add_immediate("GET", "/health", routes.health)
    router.add_immediate("GET", "/metrics", routes.metrics)
    router.add_immediate("GET", "/v1/models", routes.models)
    router.add("POST", "/v1/chat/completions", routes.chat)
    router.add("POST", "/v1/completions", routes.completions)
    router.add("POST", "/tokenize", routes.tokenize)
    router.add("POST", "/detokenize", routes.detokenize)

    return _AuthorizingHandler(state, router)


class _AuthorizingHandler:
    """The router behind the API-key check, for both of the HTTP layer's entry points."""

    def __init__(self, state: ServerState, router: Router) -> None:
        self._state = state
        self._router = router

    def _authorize(self, request: Request) -> None:
        if self._state.api_key is not None and request.path not in self._state.open_paths:
            _check_api_key(request, self._state.api_key)

    def answer_now(self, request: Request) -> Response | None:
        self._authorize(request)
        return self._router.answer_now(request)

    async def __call__(self, request: Request) -> Response | StreamingResponse:
        self._authorize(request)
        return await self._router(request)


class AuthenticationError(KestrelError):
    status = 401
    error_type = "invalid_request_error"


def _check_api_key(request: Request, api_key: str) -> None:
    header = request.header("authorization") or ""
    scheme, _, token = header.partition(" ")
    # Constant-time comparison of the whole key; the key itself is never logged or echoed.
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        log.warning("rejected a request to %s from %s: missing or wrong API key", request.path, request.client)
        raise AuthenticationError("Incorrect or missing API key (send 'Authorization: Bearer <key>')",
                                  code="invalid_api_key")


_PARSE_IN_THREAD_FROM_BYTES = 64 * 1024  # smaller bodies parse in well under a millisecond


class _Routes:
    def __init__(self, state: ServerState) -> None:
        self.state = state

    def health(self, request: Request) -> Response:
        status, body = self.state.health()
        return _json(status, body)

    def metrics(self, request: Request) -> Response:
        state = self.state
        parts = [source.metrics.render() for source in (state.engine, state.http) if source is not None]
        return Response(status=200, body="".join(parts).encode(), content_type=PROMETHEUS_CONTENT_TYPE)

    def models(self, request: Request) -> Response:
        model = self.state.model
        return _json(200, oa.models_list([self.state.model_id], self.state.created,
                                         max_model_len=None if model is None else model.context_length))

    async def _parse(self, parse, body: bytes):
        """``parse(body)``; a large body is parsed in a worker thread, off the event loop."""
        if len(body) < _PARSE_IN_THREAD_FROM_BYTES:
            return parse(body)
        return await self._off_loop(parse, body)

    async def _off_loop(self, function, *args):
        """``function(*args)`` in a worker thread: templates and tokenizers are CPU work of any length."""
        return await trio.to_thread.run_sync(function, *args, limiter=self.state.text_workers)

    def _ready(self, requested_model: str | None) -> tuple[Model, Engine]:
        state = self.state
        # "draining" still serves: a balancer needs a health-check interval to stop sending here.
        if state.model is None or state.engine is None or state.status not in ("ok", "draining"):
            raise EngineUnavailableError(f"the server is not ready (status: {state.status})", retry_after=5)
        if requested_model is not None and requested_model != state.model_id:
            raise ModelNotFoundError(f"The model {requested_model!r} does not exist; this server serves "
                                     f"{state.model_id!r}", param="model", code="model_not_found")
        return state.model, state.engine

    async def chat(self, request: Request) -> Response | StreamingResponse:
        # A text-only model refuses images just below.
        chat = await self._parse(functools.partial(oa.parse_chat_request, allow_images=True), request.body)
        model, engine = self._ready(chat.model)
        images = await prepare_images(model, chat.messages, self.state.images, self.state.image_workers)
        tool_choice = chat.tool_choice or ("auto" if chat.tools else "none")
        tools = list(chat.tools) if chat.tools and tool_choice != "none" else None
        prompt = await self._off_loop(functools.partial(
            model.apply_chat_template, template_parts(chat.template_messages()), add_generation_prompt=True,
            tools=tools, **chat.chat_template_kwargs,
        ))
        thinking = model.tokenizer is not None and model.tokenizer.token_to_id("<think>") is not None
        forced = oa.forced_tool_prefix(tool_choice) if tools else ""
        if forced:
            if thinking and not prompt.endswith(_NO_THINKING):
                prompt += _NO_THINKING  # a forced call skips reasoning, as enable_thinking=False renders it
            prompt += forced
        options = ChatOptions(reasoning=thinking, starts_in_reasoning=thinking and prompt.rstrip().endswith("<think>"),
                              parse_tools=tools is not None, forced_prefix=forced)
        ids = await self._off_loop(functools.partial(model.encode_prompt, prompt, param="messages"))
        if images:
            assert model.vision is not None
            ids = expand_image_pads(ids, model.vision.config.image_token_id, [image.num_tokens for image in images])
        job = Job(self.state, model, engine, chat.sampling, ids, "messages", chat=options,
                  model_id=self.state.model_id, images=tuple(images))
        return await job.respond()

    async def completions(self, request: Request) -> Response | StreamingResponse:
        req = await self._parse(oa.parse_completion_request, request.body)
        model, engine = self._ready(req.model)
        if isinstance(req.prompt, str):
            ids = await self._off_loop(functools.partial(model.encode_prompt, req.prompt, param="prompt"))
        else:
            ids = list(req.prompt)
            model.check_token_ids(ids, param="prompt")
        if not ids:
            raise BadRequestError("'prompt' encodes to no tokens", param="prompt")
        job = Job(self.state, model, engine, req.sampling, ids, "prompt", chat=None, model_id=self.state.model_id,
                  echo=req.prompt if (req.echo and isinstance(req.prompt, str)) else None)
        return await job.respond()

    async def tokenize(self, request: Request) -> Response:
        req = await self._parse(oa.parse_tokenize_request, request.body)
        model, _ = self._ready(req.model)
        if req.messages is not None:
            text = await self._off_loop(functools.partial(
                model.apply_chat_template, list(req.messages), add_generation_prompt=req.add_generation_prompt,
                **req.chat_template_kwargs,
            ))
        else:
            text = req.prompt or ""
        ids = await self._off_loop(model.encode, text)
        return _json(200, {"count": len(ids), "max_model_len": model.context_length, "tokens": ids})

    async def detokenize(self, request: Request) -> Response:
        req = await self._parse(oa.parse_detokenize_request, request.body)
        model, _ = self._ready(req.model)
        if req.tokens:
            model.check_token_ids(list(req.tokens), param="tokens")
        return _json(200, {"prompt": model.decode(list(req.tokens))})


class ModelNotFoundError(KestrelError):
    status = 404
    error_type = "invalid_request_error"
