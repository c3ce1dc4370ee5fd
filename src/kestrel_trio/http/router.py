"""A minimal router usable as a :data:`Handler`: exact paths, path prefixes, HEAD from GET, body media types."""

from __future__ import annotations

import attrs

from kestrel_trio.http.responses import error_response
from kestrel_trio.http.types import Handler, Immediate, ImmediateAnswer, Request, Response, Route, StreamingResponse

__all__ = ["Router", "media_type", "answer_route"]


@attrs.frozen
class _Route:
    handler: Handler
    media_types: frozenset[str] | None  # the body's accepted media types (lower case); None: any


class Router:
    """Dispatch requests on ``(method, path)``.

    A path is matched exactly, or else by the longest registered prefix (for
    routes added with ``prefix=True``, e.g. ``/v1/models/`` for
    ``/v1/models/{id}``). An unknown path gets a 404 envelope; a known path
    with another method gets a 405 envelope with an ``Allow`` header. Every
    GET route also answers HEAD (the same status and headers; the server
    sends no body). A route given ``media_types`` refuses a request whose
    ``Content-Type`` is missing or another media type with 415, before its
    handler runs. :meth:`route` resolves a request once, to a refusal, an
    :class:`Immediate` answer (routes added with :meth:`add_immediate`) or the
    handler to run; the server calls it before the body is read when the
    client waits on ``Expect: 100-continue``.
    """

    def __init__(self) -> None:
        self._routes: dict[str, dict[str, _Route]] = {}
        self._prefixes: list[str] = []  # longest first
        self._immediate: dict[tuple[str, str], ImmediateAnswer] = {}

    def add(self, method: str, path: str, handler: Handler, *, prefix: bool = False,
            media_types: tuple[str, ...] | None = None) -> None:
        """Route ``method path`` to ``handler``.

        Args:
            method: the HTTP method (case-insensitive). GET also serves HEAD.
            path: the exact request path, without query string; with
                ``prefix``, the start of every path routed here.
            handler: the async function answering matching requests.
            prefix: match every longer path that starts with ``path``.
            media_types: the request body's accepted media types, compared
                case-insensitively and without parameters (``; charset=...``);
                None accepts any body.

        Raises:
            ValueError: the route is already taken.
        """
        methods = self._routes.setdefault(self._key(path, prefix), {})
        method = method.upper()
        if method in methods or (method == "GET" and "HEAD" in methods):
            raise ValueError(f"route {method} {path} is already registered")
        accepted = None if media_types is None else frozenset(media.lower() for media in media_types)
        methods[method] = _Route(handler, accepted)
        if method == "GET":
            methods["HEAD"] = methods[method]

    def _key(self, path: str, prefix: bool) -> str:
        if not prefix:
            return path
        key = "\0" + path  # never a request path, so an exact route and a prefix route cannot collide
        if path not in self._prefixes:
            self._prefixes.append(path)
            self._prefixes.sort(key=len, reverse=True)
        return key

    def add_immediate(self, method: str, path: str, answer: ImmediateAnswer, *, prefix: bool = False) -> None:
        """Route ``method path`` to a synchronous ``answer`` that never waits (e.g. a health probe).

        Raises:
            ValueError: the route is already taken.
        """

        async def handler(request: Request) -> Response:
            return answer(request)

        self.add(method, path, handler, prefix=prefix)
        key = self._key(path, prefix)
        self._immediate[(method.upper(), key)] = answer
        if method.upper() == "GET":
            self._immediate[("HEAD", key)] = answer

    def _lookup(self, path: str) -> str | None:
        """The route key serving ``path``, or None."""
        if path in self._routes:
            return path
        for start in self._prefixes:
            if path.startswith(start) and len(path) > len(start):
                return "\0" + start
        return None

    def route(self, request: Request) -> Route:
        """What answers ``request``: a refusal (404, 405, 415), an :class:`Immediate` answer, or its handler."""
        key = self._lookup(request.path)
        refusal = self._refusal(request, key)
        if refusal is not None:
            return refusal
        assert key is not None
        answer = self._immediate.get((request.method, key))
        return Immediate(answer) if answer is not None else self._routes[key][request.method].handler

    def answer_now(self, request: Request) -> Response | None:
        """The response of an immediate route, or a refusal (404, 405, 415); None for the other routes."""
        route = self.route(request)
        if isinstance(route, Immediate):
            return route.answer(request)
        return route if isinstance(route, Response) else None

    def _refusal(self, request: Request, key: str | None) -> Response | None:
        if key is None:
            return error_response(404, f"Unknown path: {request.path}", code="unknown_url")
        methods = self._routes[key]
        route = methods.get(request.method)
        if route is None:
            allow = ", ".join(sorted(methods))
            return error_response(
                405,
                f"Method {request.method} is not allowed for {request.path}",
                code="method_not_allowed",
                headers=(("allow", allow),),
            )
        if route.media_types is not None:
            content_type = request.header("content-type")
            if content_type is None or media_type(content_type) not in route.media_types:
                return _unsupported_media_type(content_type, route.media_types)
        return None

    async def __call__(self, request: Request) -> Response | StreamingResponse:
        return await answer_route(self.route(request), request)


async def answer_route(route: Route, request: Request) -> Response | StreamingResponse:
    """The response of a resolved ``route`` to ``request`` (for a router used as a plain :data:`Handler`)."""
    if isinstance(route, Response):
        return route
    if isinstance(route, Immediate):
        return route.answer(request)
    return await route(request)


def media_type(content_type: str) -> str:
    """The media type of a ``Content-Type`` value, lower case, without parameters (``Application/JSON; charset=utf-8`` -> ``application/json``)."""
    return content_type.partition(";")[0].strip().lower()


def _unsupported_media_type(content_type: str | None, accepted: frozenset[str]) -> Response:
    wanted = " or ".join(sorted(accepted))
    got = "no Content-Type" if content_type is None else f"Content-Type {content_type!r}"
    return error_response(
        415,
        f"The request body must be sent as {wanted} (got {got}); e.g. curl -H 'Content-Type: {min(accepted)}'",
        code="unsupported_media_type",
    )
