"""Cross-origin resource sharing (CORS): which web pages on other origins may call the server.

Theory of operation
-------------------
A browser lets a page read a response from another origin only if the
response names the page's origin in ``Access-Control-Allow-Origin``. Before a
request that a plain HTML form could not send (a JSON body, an
``Authorization`` header), it first asks with a *preflight*: ``OPTIONS`` with
``Origin`` and ``Access-Control-Request-Method``, and no credentials.

:class:`CorsPolicy` is sans-IO; the connection asks it two things per request:

* :meth:`CorsPolicy.preflight` - the answer to a preflight, before any API-key
  check or routing: 204 with the allowed methods, headers and
  ``Access-Control-Max-Age`` for an allowed origin, 403 (and no CORS headers)
  otherwise. Any other request gets None and goes on as usual.
* :meth:`CorsPolicy.response_headers` - the headers added to whatever response
  the request gets (success, error envelope, 404/405/401, 413/431/408, SSE):
  ``Access-Control-Allow-Origin`` (the request's own origin, echoed) for an
  allowed origin, nothing for another one. ``Vary: Origin`` goes on every
  response once any origin is allowed, since the answer then depends on it.

Origins are compared after normalization (lower-case scheme and host, default
port dropped), as browsers serialize them. ``*`` allows every origin.
"""

from __future__ import annotations

import re
from typing import Iterable
from urllib.parse import urlsplit

import attrs

from kestrel_trio.http.responses import error_response
from kestrel_trio.http.types import Request, Response

__all__ = ["CorsPolicy", "normalize_origin"]

ANY_ORIGIN = "*"
_DEFAULT_PORTS = {"http": 80, "https": 443}
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # an HTTP field name (RFC 9110 token)
_Headers = tuple[tuple[str, str], ...]


def normalize_origin(text: str) -> str:
    """``text`` as a browser would send it in ``Origin``, or ``*``.

    Args:
        text: ``*``, ``null`` (pages from ``file://`` or sandboxed frames) or
            ``scheme://host[:port]``; one trailing ``/`` is tolerated.

    Returns:
        The origin with scheme and host lower-cased and a default port dropped,
        e.g. ``"HTTP://Example.com:80/"`` -> ``"http://example.com"``.

    Raises:
        ValueError: ``text`` is not an origin (a path, query, user name, no host...).
    """
    text = text.strip()
    if text in (ANY_ORIGIN, "null"):
        return text
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"{text!r} is not an origin: {exc}") from None
    if not parts.scheme or not parts.hostname or "://" not in text:
        raise ValueError(f"{text!r} is not an origin: write scheme://host[:port], e.g. http://127.0.0.1:3000")
    if parts.path not in ("", "/") or parts.query or parts.fragment or "?" in text or "#" in text:
        raise ValueError(f"{text!r} is not an origin: an origin has no path, query or fragment")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"{text!r} is not an origin: an origin has no user name or password")
    scheme, host = parts.scheme.lower(), parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"  # IPv6 literal
    if port is None or port == _DEFAULT_PORTS.get(scheme):
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


def _normalized_set(origins: Iterable[str]) -> frozenset[str]:
    if isinstance(origins, str):
        raise TypeError("origins must be an iterable of origins, not one string")
    return frozenset(normalize_origin(origin) for origin in origins)


@attrs.frozen
class CorsPolicy:
    """The origins whose pages may call the server, and what a preflight answers.

    Attributes:
        origins: allowed origins (normalized on construction); ``*`` allows any.
            Empty: no cross-origin page may call; preflights get 403.
        allow_methods: methods a preflight allows.
        allow_headers: request headers a preflight always allows; headers the
            browser asks for beyond these are allowed too (the origin is trusted).
        expose_headers: response headers the page's script may read beyond the
            CORS-safelisted ones.
        max_age: seconds a browser may cache a preflight's answer.

    Raises:
        ValueError: an entry of ``origins`` is not an origin.
    """

    origins: frozenset[str] = attrs.field(default=frozenset(), converter=_normalized_set)
    allow_methods: tuple[str, ...] = ("GET", "HEAD", "POST", "OPTIONS")
    allow_headers: tuple[str, ...] = ("Authorization", "Content-Type")
    expose_headers: tuple[str, ...] = ("Retry-After",)
    max_age: int = 600

    def allows(self, origin: str | None) -> bool:
        """Whether a page of ``origin`` (an ``Origin`` header value) may read responses."""
        if origin is None or not self.origins:
            return False
        if ANY_ORIGIN in self.origins:
            return True
        try:
            return normalize_origin(origin) in self.origins
        except ValueError:
            return False

    @staticmethod
    def is_preflight(request: Request) -> bool:
        """An ``OPTIONS`` request carrying ``Origin`` and ``Access-Control-Request-Method``."""
        return (request.method == "OPTIONS" and request.header("origin") is not None
                and request.header("access-control-request-method") is not None)

    def preflight(self, request: Request) -> Response | None:
        """The answer to a preflight (204 if its origin is allowed, else 403); None for any other request.

        The 204 carries no ``Access-Control-Allow-Origin`` of its own: like every
        response, it gets :meth:`response_headers` where it is written.
        """
        if not self.is_preflight(request):
            return None
        origin = request.header("origin")
        if not self.allows(origin):
            return error_response(
                403, f"Cross-origin requests from {origin!r} are not allowed on this server (serve --cors-origin)",
                code="cors_origin_not_allowed",
            )
        return Response(status=204, headers=(
            ("access-control-allow-methods", ", ".join(self.allow_methods)),
            ("access-control-allow-headers", ", ".join(self._allowed_headers(request))),
            ("access-control-max-age", str(self.max_age)),
            ("vary", "Access-Control-Request-Method, Access-Control-Request-Headers"),
        ), content_type="")

    def response_headers(self, origin: str | None) -> _Headers:
        """The CORS headers for any response to a request whose ``Origin`` is ``origin`` (None: no header)."""
        if not self.origins:
            return ()
        if not self.allows(origin):
            return (("vary", "Origin"),)
        assert origin is not None
        headers: _Headers = (("access-control-allow-origin", origin), ("vary", "Origin"))
        if self.expose_headers:
            headers += (("access-control-expose-headers", ", ".join(self.expose_headers)),)
        return headers

    def _allowed_headers(self, request: Request) -> list[str]:
        allowed = list(self.allow_headers)
        known = {name.lower() for name in allowed}
        for name in (request.header("access-control-request-headers") or "").split(","):
            name = name.strip()
            if _TOKEN.match(name) and name.lower() not in known:
                allowed.append(name.lower())
                known.add(name.lower())
        return allowed
