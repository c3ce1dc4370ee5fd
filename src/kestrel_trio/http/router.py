"""A minimal exact-path router usable as a :data:`Handler`."""

from __future__ import annotations

from kestrel_trio.http.responses import error_response
from kestrel_trio.http.types import Handler, ImmediateAnswer, Request, Response, StreamingResponse

__all__ = ["Router"]


class Router:
    """Dispatch requests on ``(method, exact path)``.

    An unknown path gets a 404 envelope; a known path with another method gets
    a 405 envelope with an ``Allow`` header. HEAD is not derived from GET.
    Routes added with :meth:`add_immediate` and the 404/405 answers are also
    given by :meth:`answer_now`, which the server tries first.
    """

    def __init__(self) -> None:
        self._routes: dict[str, dict[str, Handler]] = {}
        self._immediate: dict[tuple[str, str], ImmediateAnswer] = {}

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

    def add_immediate(self, method: str, path: str, answer: ImmediateAnswer) -> None:
        """Route ``method path`` to a synchronous ``answer`` that never waits (e.g. a health probe).

        Raises:
            ValueError: the route is already taken.
        """

        async def handler(request: Request) -> Response:
            return answer(request)

        self.add(method, path, handler)
        self._immediate[(method.upper(), path)] = answer

    def answer_now(self, request: Request) -> Response | None:
        """The response of an immediate route, a 404 or a 405; None for the other routes."""
        answer = self._immediate.get((request.method, request.path))
        if answer is not None:
            return answer(request)
        return self._refusal(request)

    def _refusal(self, request: Request) -> Response | None:
        methods = self._routes.get(request.path)
        if methods is None:
            return error_response(404, f"Unknown path: {request.path}", code="unknown_url")
        if request.method not in methods:
            allow = ", ".join(sorted(methods))
            return error_response(
                405,
                f"Method {request.method} is not allowed for {request.path}",
                code="method_not_allowed",
                headers=(("allow", allow),),
            )
        return None

    async def __call__(self, request: Request) -> Response | StreamingResponse:
        refusal = self._refusal(request)
        if refusal is not None:
            return refusal
        return await self._routes[request.path][request.method](request)
