"""The HTTP layer of kestrel-trio: a hardened HTTP/1.1 server core on h11 and trio.

Routes are written on top of it as a :data:`Handler` (for instance a
:class:`Router`). A handler's task is cancelled (``trio.Cancelled``) when its
client disconnects or when the shutdown grace expires; ``HttpServer.shutting_down``
tells long streams that a shutdown began. This package never imports numpy
or anything model-related.
"""

from kestrel_trio.http.cors import CorsPolicy
from kestrel_trio.http.hosts import HostAllowlist, default_host_allowlist
from kestrel_trio.http.limits import HttpLimits
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
