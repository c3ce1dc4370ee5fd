"""Streamed bodies over engine generations, shared by every API front (chat, Responses, Anthropic, Ollama).

Theory of operation: a route's job reads its generations into API objects (an async generator); a streamed
answer encodes each into bytes (SSE events, NDJSON lines). What is the same for every API lives here:

* :class:`GenerationStream`, the body the HTTP layer pulls from: closing it abandons the generations, even
  if the server closes it before the first chunk was asked for (so it is an object with ``aclose`` rather
  than an async generator);
* :func:`encoded`, the chunks of such a body: a failure once the head is sent cannot change the status, so
  it is logged and answered by the API's own error chunk, and the generations are abandoned however it ends;
* :func:`respond_one`, a one-generation job answered streamed or whole.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing
from typing import TypeVar

from kestrel_trio.engine import GenerationHandle
from kestrel_trio.errors import KestrelError
from kestrel_trio.http import Response, StreamingResponse

__all__ = ["GenerationStream", "encoded", "respond_one"]

log = logging.getLogger("kestrel_trio.server")

T = TypeVar("T")


class GenerationStream:
    """A streamed body: ``chunks`` pulled in turn; closing it cancels ``handles``' generations."""

    def __init__(self, handles: Sequence[GenerationHandle], chunks: AsyncIterator[bytes]) -> None:
        self._handles = handles
        self._chunks = chunks

    def __aiter__(self) -> GenerationStream:
        return self

    async def __anext__(self) -> bytes:
        return await self._chunks.__anext__()

    async def aclose(self) -> None:
        for handle in self._handles:
            handle.cancel()
        await self._chunks.aclose()  # type: ignore[attr-defined]  # an async generator


async def encoded(items: AsyncIterator[T], encode: Callable[[T], bytes], error: Callable[[KestrelError], bytes],
                  handles: Sequence[GenerationHandle], label: str) -> AsyncIterator[bytes]:
    """``encode(item)`` for each item (empty results skipped), then ``error(exc)`` if a KestrelError ends it.

    Args:
        items: the API objects read from the generations.
        encode: an item's bytes on the wire.
        error: the API's error chunk for a failure after the head was sent.
        handles: the generations, cancelled however the stream ends.
        label: names the stream in the warning logged on a failure (``stream resp_...``).
    """
    try:
        async with aclosing(items) as it:  # type: ignore[type-var]  # an async generator
            async for item in it:
                chunk = encode(item)
                if chunk:
                    yield chunk
    except KestrelError as exc:
        log.warning("%s ended with an error: %s", label, exc.message)
        yield error(exc)
    finally:
        for handle in handles:
            handle.cancel()


async def respond_one(job, events: Callable[[GenerationHandle], AsyncIterator[T]], *,
                      encode: Callable[[T], bytes], error: Callable[[KestrelError], bytes], label: str,
                      body: Callable[[], bytes]) -> Response | StreamingResponse:
    """Submit ``job``'s one generation and answer with its events streamed, or with ``body()`` once they end.

    Submitting raises (429 / 503 / 400) before any head is sent.

    Args:
        job: a one-choice :class:`kestrel_trio.app.chat.job.CompletionJob`.
        events: reads the generation into the API's events (``job.fields.stream`` or not).
        encode, error, label: as for :func:`encoded`.
        body: the whole answer's JSON body, once every event was read.
    """
    handles = job.engine.open_generations(job.requests)
    if job.fields.stream:
        return StreamingResponse(status=200, chunks=lambda: GenerationStream(
            handles, encoded(events(handles[0]), encode, error, handles, label)))
    try:
        async with aclosing(events(handles[0])) as all_events:  # type: ignore[type-var]
            async for _ in all_events:
                pass
    finally:
        handles[0].cancel()
    return Response(status=200, body=body())
