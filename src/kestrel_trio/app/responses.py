"""OpenAI's Responses API, stateless: ``POST /v1/responses``, and a clear 404 for the stored-response routes.

Theory of operation: the body is translated into the server's chat request
(:mod:`kestrel_trio.openai.responses_api`), prepared by the same code as ``/v1/chat/completions`` (template,
tools, images, grammar, token ids: :meth:`_Routes.prepare_chat`) and run as a one-choice
:class:`CompletionJob`. Its output goes through the same :class:`kestrel_trio.openai.ChatChoice` (reasoning
split, tool calls), whose items a :class:`ResponseAssembler` turns into the Response or its events.

Every refusal before the response head is OpenAI's error envelope with the error's status (the router's
handler catches the :class:`KestrelError`); once a stream has started, a failure is an ``error`` event and a
``response.failed`` event, and the stream ends.

``POST /v1/responses/input_tokens`` counts the prompt of the same fields, as ``usage.input_tokens`` would.
Nothing is stored, whatever ``store`` says, so ``GET`` / ``DELETE /v1/responses/{id}``,
``.../input_items`` and ``.../cancel`` answer 404 saying so.

``reasoning.effort`` is the chat request's reasoning choice (``none`` / ``minimal`` off, ``low`` to ``max``
on), carried out by :mod:`kestrel_trio.app.chat.thinking` as for ``reasoning_effort`` on chat, with the
``--reasoning`` default when it is left out; a refusal names ``reasoning.effort``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import attrs

from kestrel_trio.app.chat.job import CompletionJob
from kestrel_trio.app.streams import respond_one
from kestrel_trio.engine import GenerationHandle
from kestrel_trio.errors import BadRequestError, ModelNotFoundError
from kestrel_trio.http import Request, Response, StreamingResponse
from kestrel_trio.openai import to_json_bytes
from kestrel_trio.openai import responses_api as ra

__all__ = ["ResponsesRoutes", "RESPONSES_PATH", "INPUT_TOKENS_PATH", "STORED_RESPONSES_PREFIX"]

RESPONSES_PATH = "/v1/responses"
INPUT_TOKENS_PATH = "/v1/responses/input_tokens"
STORED_RESPONSES_PREFIX = "/v1/responses/"


class ResponsesRoutes:
    """The Responses routes, over the chat routes' preparation (``routes``: the app's ``_Routes``)."""

    def __init__(self, routes) -> None:
        self.routes = routes

    async def create(self, request: Request) -> Response | StreamingResponse:
        """``POST /v1/responses``."""
        created_at = int(time.time())
        req = await self.routes._parse(ra.parse_responses_request, request.body)
        chat, prepared = await self._prepare(req)
        job = self.routes.chat_job(prepared, chat.sampling)
        # The engine's admission errors (prompt + max_output_tokens over the context) name the prompt's field.
        job.requests = [attrs.evolve(request, prompt_param="input") for request in job.requests]
        params = job.requests[0].params
        # The sampling the answer gets (the request's, else the server's and the model's defaults), as OpenAI reports.
        echo = {**req.echo, "temperature": params.temperature, "top_p": params.top_p}
        assembler = ra.ResponseAssembler(ra.new_response_id(), job.model_id, created_at, echo, len(prepared.ids))
        return await ResponseJob(job, assembler).respond()

    async def input_tokens(self, request: Request) -> Response:
        """``POST /v1/responses/input_tokens``: the prompt's tokens, the ``usage.input_tokens`` of the same request."""
        req = await self.routes._parse(ra.parse_input_tokens_request, request.body)
        _, prepared = await self._prepare(req)
        return Response(status=200, body=to_json_bytes({"object": "response.input_tokens",
                                                        "input_tokens": len(prepared.ids)}))

    async def _prepare(self, req: ra.ResponsesRequest):
        """The chat request (thinking switched as ``reasoning.effort`` asks) and its preparation."""
        chat = attrs.evolve(req.chat, thinking=req.thinking, thinking_param="reasoning.effort")
        try:
            return chat, await self.routes.prepare_chat(chat)
        except BadRequestError as exc:
            raise _named_input(exc, req) from None

    @staticmethod
    def stored(request: Request) -> Response:
        """``/v1/responses/{id}`` (and its sub-paths), any method: a 404 saying that nothing is stored."""
        raise ModelNotFoundError(f"{request.method} {request.path}: this server is stateless and stores no "
                                 "responses, so there is nothing to retrieve, list, cancel or delete",
                                 code="not_found")


def _named_input(exc: BadRequestError, req: ra.ResponsesRequest) -> BadRequestError:
    """A refusal by the chat preparation (an image, a prompt too long), naming the Responses field it came from."""
    if exc.param is None or not exc.param.startswith("messages"):
        return exc
    param = req.input_path(exc.param)
    return type(exc)(exc.message.replace(f"'{exc.param}'", f"'{param}'"), param=param, code=exc.code)


class ResponseJob:
    """One Response: the job's single generation, read into a Response object or a stream of events."""

    def __init__(self, job: CompletionJob, assembler: ra.ResponseAssembler) -> None:
        self.job = job
        self.assembler = assembler

    async def respond(self) -> Response | StreamingResponse:
        """Submit (429 / 503 / 400 raise here, before any head), then answer in JSON or events."""
        assembler = self.assembler
        return await respond_one(
            self.job, self.events, label=f"stream {assembler.response_id}",
            encode=lambda events: b"".join(ra.sse_event(event) for event in events),
            error=lambda exc: b"".join(ra.sse_event(event) for event in assembler.fail(exc.message)),
            body=lambda: to_json_bytes(assembler.response()))

    async def events(self, handle: GenerationHandle) -> AsyncIterator[list[dict]]:
        """The Response's events, a list per engine delta (``response.created`` first)."""
        assembler = self.assembler
        [choice] = self.job.new_choices()
        yield assembler.start()
        while True:
            delta = await self.job._next(handle)
            yield assembler.push(choice.push(delta.text), delta.completion_tokens)
            if delta.finish_reason is not None:
                events = assembler.push(choice.finish(delta.finish_reason), delta.completion_tokens)
                yield events + assembler.finish(choice.finish_reason, delta.completion_tokens, delta.cached_tokens,
                                                completed_at=int(time.time()))
                return

