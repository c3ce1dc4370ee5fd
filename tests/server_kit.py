"""Test support for the server suites: a step gate, a raw HTTP client, server start-up, a scripted model."""

from __future__ import annotations

import contextlib
import functools
import json
from typing import AsyncIterator, Callable, ContextManager, TypeVar

import attrs
import h11
import numpy as np
import openai
import pytest
import trio

from kestrel_trio.model import Model
from step_gate import StepGate, greedy_tokens, wait_until  # noqa: F401 (re-exported to the tests)
from kestrel_trio.openai import parse_sse
from kestrel_trio.server import Server, serve
from kestrel_trio.text.generation import Generation
from slow_host import allowance

HOST = "127.0.0.1"
JSON = "application/json"


@contextlib.asynccontextmanager
async def running_server(model: Model, **options) -> AsyncIterator[Server]:
    """``serve(model, port=0, **options)`` for the duration of the block."""
    async with trio.open_nursery() as nursery:
        server = await nursery.start(functools.partial(serve, model, host=HOST, port=0, **options))
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()


@attrs.frozen
class RawResponse:
    """A response as read off the socket.

    Attributes:
        status: the status code.
        headers: header names (lower-case) -> value (the last one wins).
        body: the de-chunked body.
        raw: the bytes received for this response (head and framing included).
    """

    status: int
    headers: dict[str, str]
    body: bytes
    raw: bytes

    def json(self):
        return json.loads(self.body)

    def sse_payloads(self) -> list[str]:
        """The ``data`` payloads of an SSE body (strict framing)."""
        return parse_sse(self.body)


class RawClient:
    """One TCP connection to the server, speaking HTTP/1.1 through h11's client side."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self._h11 = h11.Connection(h11.CLIENT)
        self._raw = bytearray()

    @classmethod
    async def connect(cls, port: int) -> "RawClient":
        return cls(await trio.open_tcp_stream(HOST, port))

    async def send_request(self, method: str, path: str, body: bytes = b"", headers: tuple = (),
                           content_type: str | None = JSON) -> None:
        """Send one request; the previous exchange must be complete.

        A POST says ``Content-Type: content_type`` (JSON, as the official clients send) unless
        ``headers`` carry one or ``content_type`` is None.
        """
        if self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE:
            self._h11.start_next_cycle()
        self._raw.clear()
        head = [("host", HOST), *headers]
        if method == "POST" and content_type is not None and not any(k.lower() == "content-type" for k, _ in headers):
            head.append(("content-type", content_type))
        if method != "GET" or body:
            head.append(("content-length", str(len(body))))
        data = self._h11.send(h11.Request(method=method, target=path, headers=head))
        if body:
            data += self._h11.send(h11.Data(data=body))
        data += self._h11.send(h11.EndOfMessage())
        await self.stream.send_all(data)

    async def _next_event(self):
        while True:
            event = self._h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = await self.stream.receive_some(65536)
            self._raw += data
            self._h11.receive_data(data)

    async def read_head(self) -> h11.Response:
        """The next final response head (1xx skipped)."""
        while True:
            event = await self._next_event()
            if isinstance(event, h11.Response):
                return event
            if isinstance(event, h11.ConnectionClosed):
                raise EOFError("the server closed the connection before a response")

    async def read_body(self, enough: Callable[[bytes], bool] = lambda body: False) -> bytes:
        """Body bytes until the end of the message, or until ``enough(body_so_far)``."""
        body = bytearray()
        while not enough(bytes(body)):
            event = await self._next_event()
            if isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                break
        return bytes(body)

    async def read_response(self) -> RawResponse:
        head = await self.read_head()
        body = await self.read_body()
        headers = {name.decode(): value.decode("latin-1") for name, value in head.headers}
        return RawResponse(head.status_code, headers, body, bytes(self._raw))

    async def request(self, method: str, path: str, body: bytes = b"", headers: tuple = (),
                      content_type: str | None = JSON) -> RawResponse:
        await self.send_request(method, path, body, headers, content_type)
        return await self.read_response()

    async def aclose(self) -> None:
        await self.stream.aclose()


@contextlib.asynccontextmanager
async def connected(port: int) -> AsyncIterator[RawClient]:
    """A :class:`RawClient` for the duration of the block (closed however it ends)."""
    client = await RawClient.connect(port)
    try:
        yield client
    finally:
        await client.aclose()


async def fetch(port: int, method: str, path: str, obj: object = None, headers: tuple = (),
                content_type: str | None = JSON) -> RawResponse:
    """One request on a fresh connection; ``obj`` is sent as JSON (see :meth:`RawClient.send_request`)."""
    body = b"" if obj is None else json.dumps(obj).encode()
    async with connected(port) as client:
        return await client.request(method, path, body, headers, content_type)


def event_count(body: bytes) -> int:
    """Complete SSE events in ``body`` so far."""
    return body.count(b"\n\n")


def assert_envelope(response: RawResponse, status: int) -> dict:
    """An OpenAI error envelope with ``status``; returns its ``error`` object."""
    assert response.status == status, response.body
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    return error


def client_for(server: Server) -> openai.OpenAI:
    """The official openai client pointed at ``server`` (no retries, so a refusal shows as is)."""
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=allowance(30))


T = TypeVar("T")


async def in_worker(open_client: Callable[[], ContextManager], work: Callable[..., T], *args) -> T:
    """``work(client, *args)`` in a worker thread, ``client`` a synchronous SDK client ``open_client()`` opens.

    The official clients block; the server runs in the test's trio loop, so they must run beside it.
    """
    def run() -> T:
        with open_client() as client:
            return work(client, *args)

    return await trio.to_thread.run_sync(run)


async def assert_left_in_decode_and_stopped(engine) -> None:
    """After a client left mid-stream: its generation was cancelled in decode within one step, none finished."""
    await wait_until(lambda: engine.metrics.cancelled.value(phase="decode") == 1)
    await wait_until(lambda: engine.active == 0)
    assert engine.max_steps_after_abandon <= 1
    assert engine.metrics.finished.value(finished_reason="length") == 0


class ScriptedModel:
    """Dictates each sampled token (from ``script(rendered_prompt)``, then EOS) by wrapping ``Generation.advance``.

    Random weights never write what a test needs. The real forward pass still runs; the scripted token is
    just made to win by a wide margin in the logits handed to the real sampler (and any grammar mask), so
    everything downstream (sampling, detokenization, the engine, the routes, HTTP) is the real code.
    """

    def __init__(self, model: Model, script: Callable[[str], str]) -> None:
        self.model = model
        self.script = script
        # id -> (the generation, its script): holding the generation keeps its id from being reused by a later
        # one (an agent loop's second turn once drew the first turn's script, a second tool call, that way).
        self._scripts: dict[int, tuple[Generation, list[int]]] = {}

    def tokens_for(self, generation: Generation) -> list[int]:
        """The token ids ``generation`` is made to write: its prompt's script, then an end-of-sequence token."""
        key = id(generation)
        if key not in self._scripts:
            tokenizer = self.model.require_tokenizer()
            prompt = tokenizer.decode(generation.prompt_ids, skip_special_tokens=False)
            self._scripts[key] = (generation, self.model.encode(self.script(prompt)) + [min(tokenizer.eos_token_ids)])
        return self._scripts[key][1]

    def install(self, monkeypatch: pytest.MonkeyPatch) -> ScriptedModel:
        """Wrap ``Generation.advance`` for the test (``monkeypatch`` undoes it)."""
        real_advance = Generation.advance
        scripted = self

        def advance(generation: Generation, logits: np.ndarray | None):
            wanted = scripted.tokens_for(generation)
            step = len(generation.generated_ids)
            if logits is not None and step < len(wanted):  # None: a prompt chunk before the last
                logits = logits.copy()  # [vocab]
                logits[wanted[step]] = logits.max() + 40.0
            return real_advance(generation, logits)

        monkeypatch.setattr(Generation, "advance", advance)
        return self
