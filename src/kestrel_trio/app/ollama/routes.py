"""Ollama's API: ``/api/chat``, ``/api/generate``, ``/api/embed``, the listings, and the refusals.

Theory of operation: a body is translated into the server's chat request (:mod:`kestrel_trio.ollama`),
prepared by the same code as ``/v1/chat/completions`` (template, tools, images, grammar, token ids:
:meth:`_Routes.prepare_chat`) and run as a one-choice :class:`CompletionJob`; a raw ``/api/generate``
prompt runs as a completion. The output goes through the same :class:`kestrel_trio.openai.ChatChoice`
(reasoning split, tool calls), whose items become Ollama's NDJSON lines (``stream`` true, Ollama's default)
or one JSON object. Embeddings share :func:`kestrel_trio.app.embeddings.embed` with ``/v1/embeddings``.

The model may be named as the server's id or with Ollama's ``:latest`` tag. Every refusal before the
response head is ``{"error": "..."}`` with the error's status; once a stream has started, a failure is an
``{"error": "..."}`` line and the stream ends. What manages Ollama's model store (pull, push, create, copy,
delete, blobs) is refused with a 400 saying so: this server serves the one model it was started with.
"""

from __future__ import annotations

import datetime
import functools
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing

import attrs
import trio

from kestrel_trio import ollama as ol
from kestrel_trio.app.chat.grammar import completion_constraint
from kestrel_trio.app.chat.job import CompletionJob
from kestrel_trio.app.embeddings import embed
from kestrel_trio.app.envelopes import errors_as
from kestrel_trio.app.ollama.facts import model_facts
from kestrel_trio.app.streams import GenerationStream, encoded
from kestrel_trio.engine import GenerationHandle
from kestrel_trio.errors import BadRequestError, KestrelError, ModelNotFoundError
from kestrel_trio.http import Request, Response, StreamingResponse
from kestrel_trio.http.responses import kestrel_error_response
from kestrel_trio.text.chat_formats import QWEN3
from kestrel_trio.text.chat_formats.call_json import ObjectEnd

__all__ = ["OllamaRoutes", "OLLAMA_PREFIX", "ollama_error_response", "add_ollama_routes"]

log = logging.getLogger("kestrel_trio.server")

OLLAMA_PREFIX = "/api/"
_STORE_PATHS = {  # Ollama's model-store routes: (method, path, prefix)
    ("POST", "/api/pull", False), ("POST", "/api/push", False), ("POST", "/api/create", False),
    ("POST", "/api/copy", False), ("DELETE", "/api/delete", False), ("POST", "/api/blobs/", True),
    ("HEAD", "/api/blobs/", True),
}
_DONE_REASONS = {"tool_calls": "stop"}  # Ollama ends a tool-calling answer with "stop"


def ollama_error_response(exc: KestrelError) -> Response:
    """Ollama's error body for ``exc``, with its status (and ``Retry-After`` when it has one)."""
    return kestrel_error_response(exc, ol.error_body(exc.message))


def add_ollama_routes(router, routes, json_media_types: tuple[str, ...]) -> None:
    """Every ``/api/...`` route on ``router`` (``routes``: the app's ``_Routes``)."""
    api = OllamaRoutes(routes)
    for path, handler in (("/api/chat", api.chat), ("/api/generate", api.generate), ("/api/embed", api.embed),
                          ("/api/embeddings", api.embeddings), ("/api/show", api.show)):
        router.add("POST", path, handler, media_types=json_media_types)
    for path, handler in (("/api/tags", api.tags), ("/api/ps", api.ps), ("/api/version", api.version)):
        router.add("GET", path, handler)
    for method, path, prefix in _STORE_PATHS:
        router.add(method, path, api.store, prefix=prefix)


class OllamaRoutes:
    """The ``/api/...`` handlers, over the chat routes' preparation (``routes``: the app's ``_Routes``)."""

    def __init__(self, routes) -> None:
        self.routes = routes

    @property
    def model_id(self) -> str:
        return self.routes.state.model_id

    def _check_name(self, name: str) -> None:
        if name not in ol.names_of(self.model_id):
            raise ModelNotFoundError(f"model {name!r} not found; this server serves {ol.listed_name(self.model_id)!r} "
                                     "(it cannot pull others)", param="model")

    @errors_as(ollama_error_response)
    async def chat(self, request: Request) -> Response | StreamingResponse:
        started = _now_ns()
        req = await self.routes._parse(ol.parse_chat, request.body)
        self._check_name(req.chat.model)
        if req.empty:  # Ollama's "load the model" call: it is loaded; answered at once
            return self._loaded({"message": {"role": "assistant", "content": ""}}, req.chat.sampling.stream)
        return await self._run_chat(req, started, generate=False)

    def _loaded(self, body: dict, stream: bool) -> Response:
        self.routes._ready(None)
        body = {"model": self.model_id, "created_at": ol.created_at(), **body, "done": True, "done_reason": "load"}
        return Response(status=200, body=ol.ndjson_line(body), content_type=ol.NDJSON if stream else "application/json")

    @errors_as(ollama_error_response)
    async def generate(self, request: Request) -> Response | StreamingResponse:
        started = _now_ns()
        req = await self.routes._parse(ol.parse_generate, request.body)
        self._check_name(req.request.chat.model)
        if req.empty:
            return self._loaded({"response": ""}, req.request.chat.sampling.stream)
        if req.raw_prompt is not None:
            return await self._run_raw(req, started)
        return await self._run_chat(req.request, started, generate=True)

    async def _run_chat(self, req: ol.OllamaChat, started: int, *, generate: bool):
        # The name was checked (with or without ":latest"); app.chat.thinking carries out `think` as any reasoning
        # choice.
        chat = attrs.evolve(req.chat, model=None, thinking=req.think, thinking_param="think")
        prepared = await self.routes.prepare_chat(chat)
        job = self.routes.chat_job(prepared, chat.sampling)
        return await OllamaJob(job, self.model_id, started, generate).respond()

    async def _run_raw(self, req: ol.OllamaGenerate, started: int):
        model, engine = self.routes._ready(None)
        chat = req.request.chat
        ids = await self.routes._off_loop(functools.partial(model.encode_prompt, req.raw_prompt, param="prompt"))
        constraint = None
        if chat.structured is not None:
            constraint = await self.routes._off_loop(completion_constraint, model, chat.structured)
        state = self.routes.state
        job = CompletionJob(model, engine, chat.sampling, ids, "prompt", chat=None, model_id=self.model_id,
                            default_max_tokens=state.default_max_tokens, sampling_defaults=state.sampling,
                            constraint=constraint)
        return await OllamaJob(job, self.model_id, started, True).respond()

    @errors_as(ollama_error_response)
    async def embed(self, request: Request) -> Response:
        started = _now_ns()
        req = await self.routes._parse(ol.parse_embed, request.body)
        self._check_name(req.model)
        result = await embed(self.routes, None, req.texts, None, req.dimensions)
        total = _now_ns() - started
        body = {"model": self.model_id, "embeddings": result.vectors, "total_duration": total, "load_duration": 0,
                "prompt_eval_count": result.prompt_tokens}
        return Response(status=200, body=ol.ndjson_line(body))

    @errors_as(ollama_error_response)
    async def embeddings(self, request: Request) -> Response:
        req = await self.routes._parse(functools.partial(ol.parse_embed, legacy=True), request.body)
        self._check_name(req.model)
        result = await embed(self.routes, None, req.texts, None, None, param="prompt")
        return Response(status=200, body=ol.ndjson_line({"embedding": result.vectors[0]}))

    def _facts(self) -> ol.ModelFacts:
        model, _ = self.routes._ready(None)
        return model_facts(model, self.model_id, self.routes.state)

    @errors_as(ollama_error_response)
    async def tags(self, request: Request) -> Response:
        return Response(status=200, body=ol.ndjson_line(ol.tags_body(self._facts())))

    @errors_as(ollama_error_response)
    async def ps(self, request: Request) -> Response:
        # Loaded for the server's life: "expires" a year on, so clients that count down never unload it.
        expires = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=365)
        return Response(status=200, body=ol.ndjson_line(ol.ps_body(self._facts(), ol.created_at(expires))))

    @errors_as(ollama_error_response)
    async def show(self, request: Request) -> Response:
        self._check_name(await self.routes._parse(ol.parse_show, request.body))
        return Response(status=200, body=ol.ndjson_line(ol.show_body(self._facts())))

    @errors_as(ollama_error_response)
    async def version(self, request: Request) -> Response:
        return Response(status=200, body=ol.ndjson_line(ol.version_body()))

    @errors_as(ollama_error_response)
    async def store(self, request: Request) -> Response:
        what = request.path.removeprefix(OLLAMA_PREFIX).split("/", 1)[0]
        raise BadRequestError(f"/api/{what} is not supported: kestrel-trio serves the one model it was started "
                              f"with ({ol.listed_name(self.model_id)}) and keeps no Ollama model store; start "
                              "`kestrel-trio serve --model ...` with another model to serve it")


def _now_ns() -> int:
    """Trio's clock in nanoseconds (the unit of Ollama's durations; a test's MockClock drives it)."""
    return int(trio.current_time() * 1e9)


class OllamaJob:
    """One Ollama answer: the job's single generation, read into NDJSON lines or one object."""

    def __init__(self, job: CompletionJob, model_id: str, started: int, generate: bool) -> None:
        self.job = job
        self.model_id = model_id
        self.generate = generate
        self.timings = ol.Timings(started)

    async def respond(self) -> Response | StreamingResponse:
        """Submit (429 / 503 / 400 raise here, before any head), then answer in NDJSON or one JSON object."""
        handles = self.job.engine.open_generations(self.job.requests)
        if self.job.fields.stream:
            return StreamingResponse(status=200, content_type=ol.NDJSON, chunks=lambda: GenerationStream(
                handles, encoded(self.lines(handles[0]), ol.ndjson_line, _error_line, handles, "an Ollama stream")))
        content, thinking, calls = [], [], []
        try:
            async with aclosing(self.lines(handles[0])) as lines:
                async for line in lines:
                    if line.get("done"):
                        final = line
                        break
                    piece = line["message"] if not self.generate else line
                    content.append(piece.get("content", piece.get("response", "")))
                    thinking.append(piece.get("thinking", ""))
                    calls.extend(piece.get("tool_calls", ()))
        finally:
            handles[0].cancel()
        return Response(status=200, body=ol.ndjson_line(self._whole("".join(content), "".join(thinking), calls,
                                                                    final)))

    def _whole(self, content: str, thinking: str, calls: list, final: dict) -> dict:
        if self.generate:
            body = {"model": self.model_id, "created_at": ol.created_at(), "response": content}
            if thinking:
                body["thinking"] = thinking
        else:
            message: dict = {"role": "assistant", "content": content}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = calls
            body = {"model": self.model_id, "created_at": ol.created_at(), "message": message}
        return {**body, **{k: v for k, v in final.items() if k not in body}}

    async def lines(self, handle: GenerationHandle) -> AsyncIterator[dict]:
        """The answer's objects: one per engine delta that carries text, then the final one (``done``)."""
        [choice] = self.job.new_choices()
        opened: dict[int, tuple[dict, ObjectEnd]] = {}  # tool calls whose arguments are not whole yet, by index
        while True:
            delta = await self.job._next(handle)
            self.timings.token(_now_ns(), delta.prompt_tokens, delta.completion_tokens)
            items = choice.push(delta.text)
            if delta.finish_reason is not None:
                items = items + choice.finish(delta.finish_reason)
            line = self._line(items, opened)
            if line is not None:
                yield line
            if delta.finish_reason is not None:
                if opened:  # a call cut off (max tokens, a stop sequence): its arguments are no JSON object
                    yield self._unfinished_calls(opened)
                reason = choice.finish_reason or delta.finish_reason
                final = self._line([], opened, empty=True)
                final.update(ol.final_fields(_DONE_REASONS.get(reason, reason), self.timings, _now_ns()))
                yield final
                return

    def _line(self, items: list[dict], opened: dict[int, tuple[dict, ObjectEnd]], *,
              empty: bool = False) -> dict | None:
        """The NDJSON object of a delta's streaming items (None when they carry nothing to send)."""
        content, thinking, calls = "", "", []
        for item in items:
            if "text" in item:  # a completions choice (raw generate)
                content += item["text"]
                continue
            delta = item["delta"]
            content += delta.get("content") or ""
            thinking += delta.get("reasoning_content") or ""
            for part in delta.get("tool_calls", ()):
                # Ollama sends a call whole: its argument pieces are gathered until their JSON object closes.
                if "id" in part:
                    opened[part["index"]] = ({"id": part["id"], "function": dict(part["function"])}, ObjectEnd())
                    continue
                call, end = opened[part["index"]]
                call["function"]["arguments"] += part["function"]["arguments"]
                end.feed(part["function"]["arguments"])
                if end.closed:
                    calls.append(opened.pop(part["index"])[0])
        if not (content or thinking or calls or empty):
            return None
        if self.generate:
            return ol.generate_chunk(self.model_id, content, thinking)
        return ol.chat_chunk(self.model_id, content, thinking, calls)

    def _unfinished_calls(self, opened: dict[int, tuple[dict, ObjectEnd]]) -> dict:
        """The line of calls cut off before their arguments closed: their text, as content.

        Ollama's ``arguments`` is an object, which an unclosed one cannot be; so the call stays the text the
        model wrote (in its chat format's call shape), as does a call cut before its arguments began.
        """
        fmt = self.job.chat.chat_format if self.job.chat is not None else QWEN3
        text = "".join(fmt.call_text(call["function"]["name"], call["function"]["arguments"], closed=False)
                       for call, _ in opened.values())
        opened.clear()
        return ol.chat_chunk(self.model_id, text)



def _error_line(exc: KestrelError) -> bytes:
    return ol.ndjson_line({"error": exc.message})
