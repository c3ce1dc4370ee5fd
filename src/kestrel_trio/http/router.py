"""A minimal exact-path router usable as a :data:`Handler`."""

from __future__ import annotations

from kestrel_trio.http.responses import error_response
from kestrel_trio.http.types import Handler, Request, Response, StreamingResponse

__all__ = ["Router"]


class Router:
    """Dispatch requests on ``(method, exact path)``.

    An unknown path gets a 404 envelope; a known path with another method gets
    a 405 envelope with an ``Allow`` header. HEAD is not derived from GET.
    """

    def __init__(self) -> None:
        self._routes: dict[str, dict[str, Handler]] = {}

    def add(self, method: str, path: str, handler: Handler) -> None:
        """Route ``method path`` to ``handler``.

        Args:
            method: the HTTP method (case-insensitive).
            path: the exact request path, without query string.
            handler: the async function answering matching requests.

        Raises:
            ValueError: the route is already taken.
        """
        methods = self._routes.setdefault(path, {})
        method = method.upper()
        if method in methods:
            raise ValueError(f"route {method} {path} is already registered")
        methods[method] = handler

    async def __call__(self, request: Request) -> Response | StreamingResponse:
        methods = self._routes.get(request.path)
        if methods is None:
            return error_response(404, f"Unknown path: {request.path}", code="unknown_url")
        handler = methods.get(request.method)
        if handler is None:
            allow = ", ".join(sorted(methods))
            return error_response(
                405,
                f"Method {request.method} is not allowed for {request.path}",
                code="method_not_allowed",
                headers=(("allow", allow),),
            )
        return await handler(request)
