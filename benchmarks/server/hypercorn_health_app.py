"""A minimal ASGI app for bench_health.py: GET /health answers a fixed JSON body.

Run by the benchmark as:
    hypercorn --worker-class trio --workers 1 --bind 127.0.0.1:PORT benchmarks/server/hypercorn_health_app.py:app

The body is taken from the ``HEALTH_BODY`` environment variable (the benchmark
copies kestrel-trio's own /health body there, so both servers send the same
bytes); any other path gets 404.
"""

from __future__ import annotations

import os

_BODY = os.environ.get("HEALTH_BODY", '{"status":"ok"}').encode()
_HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(_BODY)).encode())]
_NOT_FOUND_HEADERS = [(b"content-type", b"text/plain"), (b"content-length", b"9")]


async def app(scope, receive, send) -> None:
    """The ASGI 3 entry point: lifespan handshakes, then /health answers."""
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    if scope["type"] != "http":
        return
    if scope["method"] == "GET" and scope["path"] == "/health":
        await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
        await send({"type": "http.response.body", "body": _BODY})
    else:
        await send({"type": "http.response.start", "status": 404, "headers": _NOT_FOUND_HEADERS})
        await send({"type": "http.response.body", "body": b"not found"})


async def _lifespan(receive, send) -> None:
    # A lifespan scope carries exactly one startup and one shutdown message.
    for _ in range(2):
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
