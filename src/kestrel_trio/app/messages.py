"""Anthropic's Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

Theory of operation: the body is translated into the server's chat request
(:mod:`kestrel_trio.anthropic`), prepared by the same code as ``/v1/chat/completions`` (template, tools,
images, grammar, token ids: :meth:`_Routes.prepare_chat`) and run as a one-choice :class:`CompletionJob`.
Its output goes through the same :class:`kestrel_trio.openai.ChatChoice` (reasoning split, tool calls),
whose items a :class:`kestrel_trio.anthropic.MessageAssembler` turns into Anthropic's message or events.

Every refusal before the response head is Anthropic's error envelope with the error's status (the handler
catches the :class:`KestrelError`); once a stream has started, a failure is an ``error`` event and the
stream ends.

``thinking``: ``enabled`` / ``disabled`` is the chat request's reasoning choice, carried out as for
``reasoning_effort`` (:mod:`kestrel_trio.app.chat.thinking`); without it (or ``adaptive``) the server's
default applies. ``budget_tokens`` is checked as Anthropic checks it and is enforced: once the reasoning
holds that many tokens, ``</think>`` is forced and the answer follows (:mod:`kestrel_trio.app.chat.thinking`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from kestrel_trio import anthropic as an
from kestrel_trio.app.chat.job import CompletionJob
from kestrel_trio.app.envelopes import errors_as
from kestrel_trio.app.streams import respond_one
from kestrel_trio.engine import GenerationHandle
from kestrel_trio.errors import BadRequestError, KestrelError
from kestrel_trio.http import Request, Response, StreamingResponse
from kestrel_trio.http.responses import kestrel_error_response
from kestrel_trio.openai import to_json_bytes

__all__ = ["MessagesRoutes", "anthropic_error_response", "ANTHROPIC_PATHS"]

ANTHROPIC_PATHS = ("/v1/messages", "/v1/messages/count_tokens")


def anthropic_error_response(exc: KestrelError) -> Response:
    """Anthropic's error envelope for ``exc``, with its status (and ``Retry-After`` when it has one)."""
    return kestrel_error_response(exc, an.error_body(exc))


class MessagesRoutes:
    """The two Anthropic routes, over the chat routes' preparation (``routes``: the app's ``_Routes``)."""

    def __init__(self, routes) -> None:
        self.routes = routes

    @errors_as(anthropic_error_response)
    async def messages(self, request: Request) -> Response | StreamingResponse:
        an.check_query(request.query)
        req = await self.routes._parse(an.parse_messages_request, request.body)
        prepared = await self._prepare(req)
        job = self.routes.chat_job(prepared, req.chat.sampling)
        return await MessagesJob(job, len(prepared.ids)).respond()

    @errors_as(anthropic_error_response)
    async def count_tokens(self, request: Request) -> Response:
        an.check_query(request.query)
        req = await self.routes._parse(an.parse_count_tokens_request, request.body)
        prepared = await self._prepare(req)
        return Response(status=200, body=to_json_bytes({"input_tokens": len(prepared.ids)}))

    async def _prepare(self, req: an.MessagesRequest):
        chat = req.chat
        if req.prefill and chat.tools and chat.tool_choice not in (None, "auto", "none"):
            raise BadRequestError("a final assistant turn (a prefill) cannot be continued when 'tool_choice' forces "
                                  "a tool call", param="messages")
        return await self.routes.prepare_chat(chat, prefill=req.prefill, make_id=an.new_tool_use_id)


class MessagesJob:
    """One Anthropic answer: the job's single generation, read into a message or a stream of events."""

    def __init__(self, job: CompletionJob, input_tokens: int) -> None:
        self.job = job
        self.assembler = an.MessageAssembler(an.new_message_id(), job.model_id, input_tokens)

    async def respond(self) -> Response | StreamingResponse:
        """Submit (429 / 503 / 400 raise here, before any head), then answer in JSON or events."""
        assembler = self.assembler
        return await respond_one(
            self.job, self.events, label=f"stream {assembler.message_id}",
            encode=lambda events: b"".join(an.sse_event(name, obj) for name, obj in events),
            error=lambda exc: an.sse_event("error", an.error_object(exc.status, exc.message)),
            body=lambda: to_json_bytes(assembler.message()))

    async def events(self, handle: GenerationHandle) -> AsyncIterator[list[an.responses.Event]]:
        """The message's events, a list per engine delta (``message_start`` first)."""
        assembler = self.assembler
        [choice] = self.job.new_choices()
        yield assembler.start()
        while True:
            delta = await self.job._next(handle)
            yield assembler.push(choice.push(delta.text))
            if delta.finish_reason is not None:
                events = assembler.push(choice.finish(delta.finish_reason))
                yield events + assembler.finish(choice.finish_reason, delta.stop_sequence, delta.completion_tokens)
                return

