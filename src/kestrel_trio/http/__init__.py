"""The HTTP layer of kestrel-trio: a hardened HTTP/1.1 server core on h11 and trio.

Routes are written on top of it as a :data:`Handler` (for instance a
:class:`Router`). A handler's task is cancelled (``trio.Cancelled``) when its
client disconnects or when the shutdown grace expires; ``HttpServer.shutting_down``
tells long streams that a shutdown began. This package never imports numpy
or anything model-related.

Its rooms: ``http.protocol`` (one connection's HTTP/1.1: request cycles, h11's
events as values, writing responses, the socket) and ``http.policy`` (what the
server admits: deadlines and sizes, ``Host`` names, CORS origins). The server,
the router, the value types and the error responses sit in the package itself.
"""

from kestrel_trio.http.policy.cors import CorsPolicy
from kestrel_trio.http.policy.hosts import HostAllowlist, default_host_allowlist
from kestrel_trio.http.policy.limits import HttpLimits
from kestrel_trio.http.responses import error_response
from kestrel_trio.http.router import Router, answer_route
from kestrel_trio.http.server import HttpServer, serve_http
from kestrel_trio.http.types import Handler, Immediate, Request, Response, Route, StreamingResponse

__all__ = [
    "CorsPolicy",
    "HttpLimits",
    "HostAllowlist",
    "default_host_allowlist",
    "Request",
    "Response",
    "StreamingResponse",
    "Handler",
    "Immediate",
    "Route",
    "answer_route",
    "HttpServer",
    "serve_http",
    "Router",
    "error_response",
]
