"""The OpenAI-compatible routes: HTTP requests in, engine generations, JSON or SSE out.

This module joins the HTTP layer, the OpenAI schema layer and the engine. It
does all validation (JSON, fields, template, context length, queue room)
before a response head is sent, so every refusal is a proper HTTP status with
the OpenAI error envelope; once an SSE stream has started, a failure is sent
as an ``error`` event followed by ``[DONE]``.
"""

from __future__ import annotations

import hmac
import logging
import time
from typing import AsyncIterator, Callable

import attrs
import trio

from kestrel_trio import openai as oa
from kestrel_trio.engine import Engine, GenerationHandle, GenerationRequest
from kestrel_trio.errors import BadRequestError, EngineUnavailableError, KestrelError
from kestrel_trio.http import Request, Response, Router, StreamingResponse
from kestrel_trio.model import Model
from kestrel_trio.stats import CONTENT_TYPE as PROMETHEUS_CONTENT_TYPE
from kestrel_trio.text import SamplingParams
from kestrel_trio.text.generation import check_context

__all__ = ["ServerState", "build_router"]

log = logging.getLogger("kestrel_trio.server")

_PARAM_FIELDS = (
    "max_tokens", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "seed", "stop", "stop_token_ids", "ignore_eos",
)


@attrs.define
class ServerState:
    """What the routes read: the model and engine once ready, and the lifecycle status.

    Attributes:
        model_id: the id clients use (known before the weights load).
        status: "loading", "ok", "draining" or "broken".
        model: the loaded model, or None while loading.
        engine: the running engine, or None while loading.
        api_key: if set, every route except ``open_paths`` needs ``Authorization: Bearer <key>``.
        open_paths: routes that never need the key.
    """

    model_id: str
    status: str = "loading"
    model: Model | None = None
    engine: Engine | None = None
    api_key: str | None = None
    open_paths: frozenset[str] = frozenset({"/health", "/metrics"})
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
        if engine is not None:
            body.update(busy=engine.busy, queued=engine.queued, active=engine.active,
                        max_queued=engine.limits.max_queued, max_batch=engine.limits.max_batch)
        else:
            body.update(busy=False, queued=0, active=0)
        return (200 if status == "ok" else 503), body


def _json(status: int, obj: object, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(status=status, body=oa.to_json_bytes(obj), headers=headers)


def build_router(state: ServerState) -> Callable:
    """The request handler: the routes, behind the API-key check."""
    router = Router()
    routes = _Routes(state)
    router.add("GET", "/health", routes.health)
    router.add("GET", "/metrics", routes.metrics)
    router.add("GET", "/v1/models", routes.models)
    router.add("POST", "/v1/chat/completions", routes.chat)
    router.add("POST", "/v1/completions", routes.completions)
    router.add("POST", "/tokenize", routes.tokenize)
    router.add("POST", "/detokenize", routes.detokenize)

    async def handler(request: Request):
        if state.api_key is not None and request.path not in state.open_paths:
            _check_api_key(request, state.api_key)
        return await router(request)

    return handler


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


class _Routes:
    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def health(self, request: Request) -> Response:
        status, body = self.state.health()
        return _json(status, body)

    async def metrics(self, request: Request) -> Response:
        engine = self.state.engine
        text = engine.metrics.render() if engine is not None else ""
        return Response(status=200, body=text.encode(), content_type=PROMETHEUS_CONTENT_TYPE)

    async def models(self, request: Request) -> Response:
        return _json(200, oa.models_list([self.state.model_id], self.state.created))

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
        chat = oa.parse_chat_request(request.body)
        model, engine = self._ready(chat.model)
        if chat.sampling.n != 1:
            raise BadRequestError("n > 1 is not supported yet", param="n")
        prompt = model.apply_chat_template(
            chat.template_messages(), add_generation_prompt=True, tools=list(chat.tools) if chat.tools else None,
            **chat.chat_template_kwargs,
        )
        ids = model.encode(prompt)
        thinking = model.tokenizer is not None and model.tokenizer.token_to_id("<think>") is not None
        starts_in_reasoning = thinking and prompt.rstrip().endswith("<think>")
        job = _Job(self.state, model, engine, chat.sampling, ids, "messages", "chat.completion", reasoning=thinking,
                   starts_in_reasoning=starts_in_reasoning, model_id=self.state.model_id)
        return await job.respond()

    async def completions(self, request: Request) -> Response | StreamingResponse:
        req = oa.parse_completion_request(request.body)
        model, engine = self._ready(req.model)
        if req.sampling.n != 1:
            raise BadRequestError("n > 1 is not supported yet", param="n")
        if isinstance(req.prompt, str):
            ids = model.encode(req.prompt)
        else:
            ids = list(req.prompt)
            model.check_token_ids(ids, param="prompt")
        if not ids:
            raise BadRequestError("'prompt' encodes to no tokens", param="prompt")
        job = _Job(self.state, model, engine, req.sampling, ids, "prompt", "text_completion", reasoning=False,
                   starts_in_reasoning=False, model_id=self.state.model_id,
                   echo=req.prompt if (req.echo and isinstance(req.prompt, str)) else None)
        return await job.respond()

    async def tokenize(self, request: Request) -> Response:
        req = oa.parse_tokenize_request(request.body)
        model, _ = self._ready(req.model)
        if req.messages is not None:
            text = model.apply_chat_template(
                list(req.messages), add_generation_prompt=req.add_generation_prompt, **req.chat_template_kwargs
            )
        else:
            text = req.prompt or ""
        ids = model.encode(text)
        return _json(200, {"count": len(ids), "max_model_len": model.context_length, "tokens": ids})

    async def detokenize(self, request: Request) -> Response:
        req = oa.parse_detokenize_request(request.body)
        model, _ = self._ready(req.model)
        if req.tokens:
            model.check_token_ids(list(req.tokens), param="tokens")
        return _json(200, {"prompt": model.decode(list(req.tokens))})


class ModelNotFoundError(KestrelError):
    status = 404
    error_type = "invalid_request_error"


def _sampling_params(model: Model, fields: oa.SamplingFields) -> SamplingParams:
    requested = fields.as_dict()
    values = {name: requested[name] for name in _PARAM_FIELDS if name in requested}
    if fields.logit_bias:
        vocab = model.config.vocab_size
        for token, _bias in fields.logit_bias:
            if token >= vocab:
                raise BadRequestError(f"'logit_bias' names token {token}, outside 0..{vocab - 1}", param="logit_bias")
        values["logit_bias"] = dict(fields.logit_bias)
    defaults = model.tokenizer.generation_defaults if model.tokenizer is not None else {}
    return SamplingParams.with_defaults(values, defaults)


class _Job:
    """One chat or completion request from validation to its response."""

    def __init__(self, state: ServerState, model: Model, engine: Engine, fields: oa.SamplingFields, ids: list[int], prompt_param: str,
                 kind: str, *, reasoning: bool, starts_in_reasoning: bool, model_id: str, echo: str | None = None):
        self.state = state
        self.engine = engine
        self.fields = fields
        self.kind = kind
        self.chat = kind == "chat.completion"
        self.reasoning = reasoning
        self.starts_in_reasoning = starts_in_reasoning
        self.model_id = model_id
        self.echo = echo
        params = _sampling_params(model, fields)
        check_context(len(ids), params.max_tokens, model.context_length, param=prompt_param)
        self.request = GenerationRequest(tuple(ids), params, prompt_param=prompt_param)
        self.id = oa.new_id("chatcmpl" if self.chat else "cmpl")
        self.created = int(time.time())

    async def respond(self) -> Response | StreamingResponse:
        handle = self.engine.open_generation(self.request)  # 429 / 503 / 400 raise here, before any head
        if self.fields.stream:
            return StreamingResponse(status=200, chunks=lambda: _SSEStream(self, handle))
        async with handle:
            deltas = await _collect(self.state, handle)
        return _json(200, self._full_response(deltas))

    def _full_response(self, deltas: list) -> dict:
        last = deltas[-1]
        usage = oa.Usage(prompt_tokens=last.prompt_tokens, completion_tokens=last.completion_tokens)
        text = "".join(d.text for d in deltas)
        if not self.chat:
            return oa.completion(self.id, self.created, self.model_id, (self.echo or "") + text, last.finish_reason, usage)
        reasoning, content = (None, text)
        if self.reasoning:
            reasoning, content = oa.split_reasoning(text, self.starts_in_reasoning)
        return oa.chat_completion(self.id, self.created, self.model_id, content, reasoning or None,
                                  last.finish_reason, usage)


class _SSEStream:
    """The SSE body of a streaming response; closing it abandons the generation.

    An object with ``aclose`` rather than an async generator, so that the
    generation is abandoned even if the server closes the stream before the
    first chunk was asked for.
    """

    def __init__(self, job: _Job, handle: GenerationHandle) -> None:
        self._handle = handle
        self._events = self._generate(job, handle)

    def __aiter__(self) -> "_SSEStream":
        return self

    async def __anext__(self) -> bytes:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        self._handle.cancel()
        await self._events.aclose()

    async def _generate(self, job: _Job, handle: GenerationHandle) -> AsyncIterator[bytes]:
        include_usage = job.fields.include_usage
        ident = (job.id, job.created, job.model_id)
        splitter = oa.ReasoningSplitter(job.starts_in_reasoning) if job.reasoning else None
        if job.chat:
            yield oa.sse_event(oa.chat_chunk_role(*ident, include_usage=include_usage))
        elif job.echo:
            yield oa.sse_event(oa.completion_chunk(*ident, job.echo, include_usage=include_usage))
        last = None
        try:
            async with handle:
                while True:
                    try:
                        delta = await job.state.next_delta(handle)
                    except StopAsyncIteration:
                        break
                    last = delta
                    for event in _text_events(job, splitter, delta.text, include_usage):
                        yield event
                    if delta.finish_reason is not None:
                        break
            if last is None:
                raise KestrelError("the generation ended without output")
            if splitter is not None:
                for event in _split_events(job, splitter.flush(), include_usage):
                    yield event
            if job.chat:
                yield oa.sse_event(oa.chat_chunk_finish(*ident, last.finish_reason, include_usage=include_usage))
            else:
                yield oa.sse_event(oa.completion_chunk(*ident, "", last.finish_reason, include_usage=include_usage))
            if include_usage:
                usage = oa.Usage(prompt_tokens=last.prompt_tokens, completion_tokens=last.completion_tokens)
                maker = oa.chat_chunk_usage if job.chat else oa.completion_chunk_usage
                yield oa.sse_event(maker(*ident, usage))
        except KestrelError as exc:
            log.warning("stream %s ended with an error: %s", job.id, exc.message)
            yield oa.sse_error(exc)
        yield oa.SSE_DONE


async def _collect(state: ServerState, handle: GenerationHandle) -> list:
    deltas = []
    while True:
        try:
            delta = await state.next_delta(handle)
        except StopAsyncIteration:
            break
        deltas.append(delta)
        if delta.finish_reason is not None:
            break
    if not deltas:
        raise KestrelError("the generation ended without output")
    return deltas


def _text_events(job: _Job, splitter, text: str, include_usage: bool) -> list[bytes]:
    if not text:
        return []
    if splitter is not None:
        return _split_events(job, splitter.push(text), include_usage)
    ident = (job.id, job.created, job.model_id)
    if job.chat:
        return [oa.sse_event(oa.chat_chunk_delta(*ident, content=text, include_usage=include_usage))]
    return [oa.sse_event(oa.completion_chunk(*ident, text, include_usage=include_usage))]


def _split_events(job: _Job, parts: tuple[str, str], include_usage: bool) -> list[bytes]:
    reasoning, content = parts
    if not reasoning and not content:
        return []
    delta = oa.chat_chunk_delta(job.id, job.created, job.model_id, content=content or None,
                                reasoning_content=reasoning or None, include_usage=include_usage)
    return [oa.sse_event(delta)]
