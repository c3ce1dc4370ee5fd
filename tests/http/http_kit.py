"""Test support for the HTTP layer: a small app, a raw socket client, server start-up."""

from __future__ import annotations

import json
import socket

import attrs
import h11
import trio

from kestrel_trio.errors import BadRequestError, QueueFullError
from kestrel_trio.http import HttpLimits, HttpServer, Request, Response, Router, StreamingResponse, serve_http

HOST = "127.0.0.1"


@attrs.define
class StreamProbe:
    """Records the life of the test app's streaming generators."""

    started: trio.Event = attrs.field(factory=trio.Event)
    closed: trio.Event = attrs.field(factory=trio.Event)
    closed_at: float | None = None
    chunks_made: int = 0

    def mark_closed(self) -> None:
        self.closed_at = trio.current_time()
        self.closed.set()


class DemoApp:
    """A Router with the routes the tests exercise."""

    def __init__(self) -> None:
        self.stream = StreamProbe()
        self.router = Router()
        self.handler_cancelled = trio.Event()
        self.gate = trio.Event()  # /gate answers once this is set
        add = self.router.add
        add("GET", "/hello", self.hello)
        add("POST", "/echo", self.echo)
        add("GET", "/stream", self.endless_stream)
        add("GET", "/firehose", self.firehose)
        add("GET", "/finite", self.finite_stream)
        add("GET", "/slow", self.slow)
        add("GET", "/gate", self.gated)
        add("GET", "/kestrel", self.bad_request)
        add("GET", "/queue-full", self.queue_full)
        add("GET", "/boom", self.boom)
        add("GET", "/stream-fails", self.failing_stream)
        add("GET", "/bad-header", self.bad_header)
        add("GET", "/not-a-response", self.not_a_response)
        self.router.add_immediate("GET", "/now", self.now)
        self.router.add_immediate("GET", "/now-refuses", self.now_refuses)

    def now(self, request: Request) -> Response:
        return Response(200, json.dumps({"now": request.query}).encode())

    def now_refuses(self, request: Request) -> Response:
        raise BadRequestError("refused at once", param="now")

    async def hello(self, request: Request) -> Response:
        return Response(200, json.dumps({"hello": "world", "query": request.query}).encode())

    async def echo(self, request: Request) -> Response:
        payload = {"body": request.body.decode("latin-1"), "path": request.path, "client": request.client}
        return Response(200, json.dumps(payload).encode(), headers=(("x-echo-length", str(len(request.body))),))

    def _streaming(self, chunk: bytes, pause: float, count: int | None) -> StreamingResponse:
        probe = self.stream

        async def chunks():
            probe.started.set()
            try:
                index = 0
                while count is None or index < count:
                    probe.chunks_made += 1
                    yield chunk.replace(b"#", str(index).encode())
                    index += 1
                    await trio.sleep(pause)
            finally:
                probe.mark_closed()

        return StreamingResponse(200, chunks)

    async def endless_stream(self, request: Request) -> StreamingResponse:
        return self._streaming(b"data: #\n\n", 0.05, None)

    async def finite_stream(self, request: Request) -> StreamingResponse:
        return self._streaming(b"data: #\n\n", 0.1, 3)

    async def firehose(self, request: Request) -> StreamingResponse:
        return self._streaming(b"#" * 65536, 0, None)

    async def slow(self, request: Request) -> Response:
        try:
            await trio.sleep(3600)
        except trio.Cancelled:
            self.handler_cancelled.set()
            raise
        return Response(200)

    async def gated(self, request: Request) -> Response:
        await self.gate.wait()
        return Response(200, b"{}")

    async def bad_request(self, request: Request) -> Response:
        raise BadRequestError("temperature must be at most 2", param="temperature")

    async def queue_full(self, request: Request) -> Response:
        raise QueueFullError("the queue is full", retry_after=1.2)

    async def boom(self, request: Request) -> Response:
        raise RuntimeError("secret-internal-detail")

    async def failing_stream(self, request: Request) -> StreamingResponse:
        probe = self.stream

        async def chunks():
            try:
                yield b"data: first\n\n"
                raise BadRequestError("escaped from a stream")
            finally:
                probe.mark_closed()

        return StreamingResponse(200, chunks)

    async def bad_header(self, request: Request) -> Response:
        return Response(200, b"{}", headers=(("x-injected", "a\r\nset-cookie: evil"),))

    async def not_a_response(self, request: Request):
        return "a string"


@attrs.define
class RunningServer:
    server: HttpServer
    app: DemoApp
    stopped: trio.Event

    @property
    def port(self) -> int:
        return self.server.port


async def start_server(
    nursery: trio.Nursery, limits: HttpLimits = HttpLimits(), app: DemoApp | None = None, hosts=None
) -> RunningServer:
    """Start serve_http with a DemoApp in ``nursery``; ``stopped`` is set when it returns."""
    app = app if app is not None else DemoApp()
    stopped = trio.Event()

    async def run(task_status=trio.TASK_STATUS_IGNORED):
        try:
            await serve_http(app.router, host=HOST, port=0, limits=limits, hosts=hosts, task_status=task_status)
        finally:
            stopped.set()

    server = await nursery.start(run)
    return RunningServer(server, app, stopped)


@attrs.frozen
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)


class RawClient:
    """A raw TCP client that reads HTTP responses with h11's client-side parser."""

    open_clients: list["RawClient"] = []  # closed by the autouse fixture in conftest

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        RawClient.open_clients.append(self)
        self._buffer = b""
        self._eof = False

    @classmethod
    async def connect(cls, port: int) -> "RawClient":
        return cls(await trio.open_tcp_stream(HOST, port))

    @classmethod
    async def connect_small_window(cls, port: int, receive_buffer: int = 4096) -> "RawClient":
        """Connect with a small receive buffer (set before connect, so it takes effect)."""
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        await sock.connect((HOST, port))
        return cls(trio.SocketStream(sock))

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def request(self, method: str, path: str, body: bytes = b"", headers: tuple = ()) -> RawResponse:
        await self.send(build_request(method, path, body, headers))
        return await self.read_response(method=method)

    async def _receive(self) -> bytes:
        if self._eof:
            return b""
        try:
            data = await self.stream.receive_some(65536)
        except trio.BrokenResourceError:
            data = b""
        self._eof = not data
        return data

    async def read_response(self, method: str = "GET", stop_at_informational: bool = False) -> RawResponse:
        """Parse the next response (or 1xx if asked); raises EOFError if the server closed first."""
        parser = h11.Connection(h11.CLIENT)
        parser.send(h11.Request(method=method, target="/", headers=[("host", "test")]))
        parser.send(h11.EndOfMessage())
        if self._buffer:
            parser.receive_data(self._buffer)
        head, body = None, bytearray()
        while True:
            event = parser.next_event()
            if event is h11.NEED_DATA:
                parser.receive_data(await self._receive())
            elif isinstance(event, h11.InformationalResponse) and stop_at_informational:
                head = event
                break
            elif isinstance(event, h11.Response):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise EOFError("the server closed the connection before a response")
        self._buffer = parser.trailing_data[0]
        headers = {name.decode(): value.decode("latin-1") for name, value in head.headers}
        return RawResponse(head.status_code, headers, bytes(body))

    async def read_some(self) -> bytes:
        """Buffered bytes first, then the next read from the socket."""
        if self._buffer:
            data, self._buffer = self._buffer, b""
            return data
        return await self._receive()

    async def read_until_closed(self) -> bytes:
        """Everything until EOF or reset."""
        data = bytearray(self._buffer)
        self._buffer = b""
        while chunk := await self._receive():
            data += chunk
        return bytes(data)

    async def aclose(self) -> None:
        await self.stream.aclose()

    @classmethod
    def close_all(cls) -> None:
        """Close every client a test left open (inside the trio run)."""
        for client in cls.open_clients:
            client.stream.socket.close()
        cls.open_clients.clear()


def build_request(method: str, path: str, body: bytes = b"", headers: tuple = ()) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: test"]
    names = {name.lower() for name, _ in headers}
    if body and "content-length" not in names and "transfer-encoding" not in names:
        lines.append(f"Content-Length: {len(body)}")
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def assert_envelope(response: RawResponse, status: int, code: str | None = None) -> dict:
    """Check an OpenAI error envelope response and return its ``error`` object."""
    assert response.status == status
    assert response.headers["content-type"] == "application/json"
    assert response.headers["server"] == "kestrel-trio"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    if code is not None:
        assert error["code"] == code
    return error

