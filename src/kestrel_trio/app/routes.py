"""The OpenAI-compatible routes: HTTP requests in, engine generations, JSON or SSE out.

This module joins the HTTP layer, the OpenAI schema layer and the engine.
:func:`build_router` gives the HTTP layer one object whose ``route`` resolves a
request once: the API-key check, then the router (404 / 405 / 415, an answer
from memory, or the handler). A handler validates what is its own (JSON,
fields, template, images, grammar) and hands the generations to the engine,
whose ``open_generations`` admits them (engine state, context length, queue
room); all of it happens before a response head is sent, so every refusal is
a proper HTTP status with the OpenAI error envelope; once an SSE stream has
started, a failure is sent as an ``error`` event followed by ``[DONE]``.
"""

from __future__ import annotations

import functools
import hmac
import json
import logging
import urllib.parse

import attrs
import trio

from kestrel_trio import anthropic as an
from kestrel_trio import openai as oa
from kestrel_trio.engine import Engine
from kestrel_trio.app.state import ServerState
from kestrel_trio.errors import AuthenticationError, BadRequestError, EngineUnavailableError, ModelNotFoundError
from kestrel_trio.http import Request, Response, Route, Router, StreamingResponse, answer_route
from kestrel_trio.model import Model
from kestrel_trio.app.chat.job import ChatOptions, CompletionJob, default_sampling
from kestrel_trio.app.responses import INPUT_TOKENS_PATH, RESPONSES_PATH, STORED_RESPONSES_PREFIX, ResponsesRoutes
from kestrel_trio.app.messages import ANTHROPIC_PATHS, MessagesRoutes, anthropic_error_response
from kestrel_trio.app.embeddings import EmbeddingRoutes
from kestrel_trio.app.ollama.routes import OLLAMA_PREFIX, add_ollama_routes, ollama_error_response
from kestrel_trio.app.chat.grammar import chat_constraint, completion_constraint
from kestrel_trio.app.media.images import prepare_images, template_parts
from kestrel_trio.app.media.videos import prepare_videos
from kestrel_trio.app.chat.thinking import chat_format, plan_thinking, reasoning_budget
from kestrel_trio.text.constraints.constraint import Constraint
from kestrel_trio.text.constraints.reasoning_budget import ReasoningBudget
from kestrel_trio.text.media.images import expand_image_pads
from kestrel_trio.text.media.videos import expand_video_placeholders
from kestrel_trio.webui import add_webui_routes
from kestrel_trio.stats import CONTENT_TYPE as PROMETHEUS_CONTENT_TYPE

__all__ = ["build_router"]

log = logging.getLogger("kestrel_trio.server")


def _json(status: int, obj: object, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(status=status, body=oa.to_json_bytes(obj), headers=headers)


JSON_MEDIA_TYPES = ("application/json",)
_MODELS_PREFIX = "/v1/models/"


def build_router(state: ServerState) -> "_AuthorizingHandler":
    """The request handler: the routes, behind the API-key check."""
    router = Router()
    routes = _Routes(state)
    router.add_immediate("GET", "/health", routes.health)
    router.add_immediate("GET", "/metrics", routes.metrics)
    router.add_immediate("GET", "/v1/models", routes.models)
    # Model ids may hold "/" (Qwen/Qwen3-0.6B), sent raw or percent-encoded: every longer path is an id.
    router.add_immediate("GET", _MODELS_PREFIX, routes.model, prefix=True)
    # A body must say it is JSON: a browser's cross-site "simple" POST (text/plain, form data) starts nothing.
    for path, handler in (("/v1/chat/completions", routes.chat), ("/v1/completions", routes.completions),
                          ("/tokenize", routes.tokenize), ("/detokenize", routes.detokenize)):
        router.add("POST", path, handler, media_types=JSON_MEDIA_TYPES)
    responses = ResponsesRoutes(routes)  # OpenAI's Responses API, stateless, over the same chat preparation
    router.add("POST", RESPONSES_PATH, responses.create, media_types=JSON_MEDIA_TYPES)
    router.add("POST", INPUT_TOKENS_PATH, responses.input_tokens, media_types=JSON_MEDIA_TYPES)
    for method in ("GET", "POST", "DELETE"):  # stored responses: a 404 saying none are kept
        router.add_immediate(method, STORED_RESPONSES_PREFIX, responses.stored, prefix=True)
    messages = MessagesRoutes(routes)  # Anthropic's Messages API, over the same chat preparation
    for path, handler in zip(ANTHROPIC_PATHS, (messages.messages, messages.count_tokens)):
        router.add("POST", path, handler, media_types=JSON_MEDIA_TYPES)
    router.add("POST", "/v1/embeddings", EmbeddingRoutes(routes).embeddings, media_types=JSON_MEDIA_TYPES)
    add_ollama_routes(router, routes, JSON_MEDIA_TYPES)  # Ollama's /api/..., over the same chat preparation
    if state.webui:
        add_webui_routes(router)

    return _AuthorizingHandler(state, router)


class _AuthorizingHandler:
    """The router behind the API-key check: ``route`` resolves a request once (the HTTP layer calls it once)."""

    def __init__(self, state: ServerState, router: Router) -> None:
        self._state = state
        self._router = router

    def route(self, request: Request) -> Route:
        """401 without the right key (except on ``open_paths``), else the router's answer for ``request``.

        On Anthropic's paths a refusal (401, 405, 415) is in Anthropic's error envelope.
        """
        anthropic = request.path in ANTHROPIC_PATHS
        try:
            if self._state.api_key is not None and request.path not in self._state.open_paths:
                _check_api_key(request, self._state.api_key, anthropic=anthropic)
        except AuthenticationError as exc:
            if anthropic:
                return anthropic_error_response(exc)
            if request.path.startswith(OLLAMA_PREFIX):
                return ollama_error_response(exc)
            raise
        route = self._router.route(request)
        if anthropic and isinstance(route, Response) and route.status >= 400:
            return _anthropic_envelope(route)
        if request.path.startswith(OLLAMA_PREFIX) and isinstance(route, Response) and route.status >= 400:
            return _ollama_envelope(route)
        return route

    async def __call__(self, request: Request) -> Response | StreamingResponse:
        return await answer_route(self.route(request), request)


def _check_api_key(request: Request, api_key: str, *, anthropic: bool = False) -> None:
    """401 unless ``Authorization: Bearer <key>`` (or, on Anthropic's paths, ``x-api-key: <key>``) holds the key."""
    header = request.header("authorization") or ""
    scheme, _, token = header.partition(" ")
    # Constant-time comparison of the whole key; the key itself is never logged or echoed.
    if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode()):
        return
    x_api_key = request.header("x-api-key") if anthropic else None
    if x_api_key is not None and hmac.compare_digest(x_api_key.strip().encode(), api_key.encode()):
        return
    log.warning("rejected a request to %s from %s: missing or wrong API key", request.path, request.client)
    how = "'x-api-key: <key>' or 'Authorization: Bearer <key>'" if anthropic else "'Authorization: Bearer <key>'"
    raise AuthenticationError(f"Incorrect or missing API key (send {how})", code="invalid_api_key")


def _anthropic_envelope(response: Response) -> Response:
    """An OpenAI-envelope refusal of the router (404, 405, 415) re-worded in Anthropic's envelope."""
    try:
        message = json.loads(response.body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return response
    body = oa.to_json_bytes(an.error_object(response.status, message))
    return attrs.evolve(response, body=body)


def _ollama_envelope(response: Response) -> Response:
    """An OpenAI-envelope refusal of the router (404, 405, 415) or the key check re-worded as Ollama's."""
    try:
        message = json.loads(response.body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return response
    return attrs.evolve(response, body=json.dumps({"error": message}).encode())


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

    def _input_modalities(self) -> tuple[str, ...]:
        return ("text",) + (("image",) if self.state.accepts_images else ()) + (
            ("video",) if self.state.accepts_videos else ())

    def models(self, request: Request) -> Response:
        return _json(200, oa.models_list([self.state.model_id], self.state.created, max_model_len=self._max_model_len(),
                                         input_modalities=self._input_modalities(),
                                         sampling_defaults=self._sampling_defaults()))

    def model(self, request: Request) -> Response:
        """``GET /v1/models/{id}``: the model object of the served id, else 404."""
        requested = urllib.parse.unquote(request.path[len(_MODELS_PREFIX):])
        if requested != self.state.model_id:
            raise ModelNotFoundError(f"The model {requested!r} does not exist; this server serves "
                                     f"{self.state.model_id!r}", param="model", code="model_not_found")
        return _json(200, oa.model_card(self.state.model_id, self.state.created, max_model_len=self._max_model_len(),
                                        input_modalities=self._input_modalities(),
                                        sampling_defaults=self._sampling_defaults()))

    def _sampling_defaults(self) -> dict | None:
        """What a chat request gets for the sampling fields it leaves out, once the model is loaded."""
        state = self.state
        return None if state.model is None else default_sampling(state.model, state.sampling, state.default_max_tokens)

    def _max_model_len(self) -> int | None:
        """The served context (``--max-model-len`` or the model's), once the model is loaded."""
        model = self.state.model
        return None if model is None else model.context_length

    async def _parse(self, parse, body: bytes):
        """``parse(body)``; a large body is parsed in a worker thread, off the event loop."""
        if len(body) < _PARSE_IN_THREAD_FROM_BYTES:
            return parse(body)
        return await self._off_loop(parse, body)

    async def _off_loop(self, function, *args):
        """``function(*args)`` in a worker thread: templates and tokenizers are CPU work of any length."""
        async with self.state.text_workers:  # held for the call, which /health times (text_calls)
            key = object()
            self.state.text_calls[key] = trio.current_time()
            try:
                return await trio.to_thread.run_sync(function, *args)
            finally:
                del self.state.text_calls[key]

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
        prepared = await self.prepare_chat(chat)
        return await self.chat_job(prepared, chat.sampling).respond()

    async def prepare_chat(self, chat: oa.ChatRequest, *, prefill: str = "", make_id=None) -> PreparedChat:
        """Everything a chat request needs before it is queued: checks, images, prompt, grammar, token ids.

        Args:
            chat: the validated request (the Anthropic route translates its own into one).
            prefill: text the answer continues (Anthropic's final assistant turn), appended to the prompt.
            make_id: the tool-call id generator, or None for OpenAI's ``call_...`` ids.
        """
        model, engine = self._ready(chat.model)
        thinking_plan = plan_thinking(model, chat, self.state.reasoning)
        chat = attrs.evolve(chat, chat_template_kwargs=thinking_plan.template_kwargs(chat))
        model.check_chat_template_kwargs(list(chat.chat_template_kwargs))
        images = await prepare_images(model, chat.messages, self.state.images, self.state.image_workers)
        videos = await prepare_videos(model, chat.messages, self.state.videos, self.state.images,
                                      self.state.image_workers)
        tool_choice = chat.tool_choice or ("auto" if chat.tools else "none")
        tools = list(chat.tools) if chat.tools and tool_choice != "none" else None
        prompt = thinking_plan.finish_prompt(await self._off_loop(_render_chat, model, chat, tools))
        fmt = chat_format(model)  # the family's markers: reasoning block, tool-call tags
        forced = fmt.forced_tool_prefix(tool_choice) if tools else ""
        closed = fmt.is_closed(prompt)  # reasoning off: the block is rendered empty and closed
        if forced:
            prompt = fmt.skip_reasoning(prompt) + forced  # a forced call skips reasoning, as the switch off does
            closed = True
        elif chat.structured is not None:  # an answer constrained from its first token: reasoning only if asked
            prompt += fmt.reasoning_before_answer(prompt, chat.chat_template_kwargs)
            closed = fmt.is_closed(prompt)
        elif prefill:  # the answer continues the prefill: reasoning, if any, is over
            prompt = fmt.skip_reasoning(prompt) + prefill
            closed = True
        in_reasoning = fmt.ends_in_reasoning(prompt)
        budget = reasoning_budget(model, chat, prompt, closed=closed)
        options = ChatOptions(reasoning=fmt.reasons, starts_in_reasoning=in_reasoning,
                              parse_tools=tools is not None, forced_prefix=forced,
                              parallel_tool_calls=chat.parallel_tool_calls, chat_format=fmt,
                              **({} if make_id is None else {"make_id": make_id}))
        constraint = None
        if chat.structured is not None or tools:  # a schema that cannot be enforced: 400 here, before any compute
            constraint = await self._off_loop(functools.partial(
                chat_constraint, model, chat.structured, tools, tool_choice, in_reasoning=in_reasoning))
        # Videos become per-frame timestamps and pads in the text, as Qwen3VLProcessor writes them.
        tokenized = expand_video_placeholders(prompt, videos)
        ids = await self._off_loop(functools.partial(model.encode_prompt, tokenized, param="messages"))
        if images:
            assert model.vision is not None
            ids = expand_image_pads(ids, model.vision.config.image_token_id, [image.num_tokens for image in images])
        return PreparedChat(model, engine, ids, (*images, *videos), options, constraint, budget)

    def chat_job(self, prepared: PreparedChat, sampling: oa.SamplingFields) -> CompletionJob:
        """The job that runs a prepared chat request (a 400 for a bad sampling field)."""
        return CompletionJob(prepared.model, prepared.engine, sampling, prepared.ids, "messages",
                             chat=prepared.options, model_id=self.state.model_id,
                             default_max_tokens=self.state.default_max_tokens, sampling_defaults=self.state.sampling,
                             images=prepared.images, constraint=prepared.constraint,
                             reasoning_budget=prepared.reasoning_budget)

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
        constraint = None
        if req.structured is not None:
            constraint = await self._off_loop(completion_constraint, model, req.structured)
        job = CompletionJob(model, engine, req.sampling, ids, "prompt", chat=None, model_id=self.state.model_id,
                            default_max_tokens=self.state.default_max_tokens, sampling_defaults=self.state.sampling,
                            echo=req.prompt if (req.echo and isinstance(req.prompt, str)) else None,
                            constraint=constraint)
        return await job.respond()

    async def tokenize(self, request: Request) -> Response:
        req = await self._parse(oa.parse_tokenize_request, request.body)
        model, _ = self._ready(req.model)
        if req.messages is not None:  # rendered as chat renders it, reasoning choice included (same count)
            plan = plan_thinking(model, req, self.state.reasoning)
            kwargs = plan.template_kwargs(req)
            model.check_chat_template_kwargs(list(kwargs))
            text = await self._off_loop(functools.partial(
                model.apply_chat_template, req.template_messages(), add_generation_prompt=req.add_generation_prompt,
                tools=None if req.tools is None else list(req.tools), **kwargs,
            ))
            text = plan.finish_prompt(text) if req.add_generation_prompt else text
        else:
            text = req.prompt or ""
        param = "prompt" if req.messages is None else "messages"
        ids = await self._off_loop(functools.partial(model.encode_within_context, text, param=param))
        return _json(200, {"count": len(ids), "max_model_len": model.context_length, "tokens": ids})

    async def detokenize(self, request: Request) -> Response:
        req = await self._parse(oa.parse_detokenize_request, request.body)
        model, _ = self._ready(req.model)
        if req.tokens:
            model.check_token_ids(list(req.tokens), param="tokens")
        return _json(200, {"prompt": model.decode(list(req.tokens))})


@attrs.frozen
class PreparedChat:
    """A chat request ready to queue: the model and engine, the prompt's ids and images, how output is read.

    Attributes:
        model: the served model.
        engine: the running engine.
        ids: the prompt's token ids (image pads expanded).
        images: the prompt's preprocessed images.
        options: how the output is assembled (reasoning, tool calls).
        constraint: the compiled grammar the output follows, or None.
        reasoning_budget: the tokens the reasoning block may hold before ``</think>`` is forced, or None.
    """

    model: Model
    engine: Engine
    ids: list[int]
    images: tuple
    options: ChatOptions
    constraint: Constraint | None
    reasoning_budget: ReasoningBudget | None = None


def _render_chat(model: Model, chat: oa.ChatRequest, tools: list | None) -> str:
    """The prompt text of a validated chat request, generation prompt added (a worker thread's work).

    Copying the messages for the template is part of it: for 60,000 messages the copy alone held the event loop
    185 ms on the 2-core Zen 3.
    """
    return model.apply_chat_template(template_parts(chat.template_messages()), add_generation_prompt=True,
                                     tools=tools, **chat.chat_template_kwargs)
