"""The built-in chat page: static files from package data, served at ``/`` and ``/webui/*``.

The page is plain HTML, CSS and JavaScript (no build step, no remote loads) and
talks to the server's own OpenAI API (``/v1/models``, ``/v1/chat/completions``)
like any other client, with the user's API key if the server wants one. Its
files hold nothing secret, so they need no key: without them a browser could
not even ask for one.

The files: ``index.html`` (the page), ``style.css``, ``icon.svg``, and the script as
ES modules: ``app.js`` (the entry: the page's state, API key, settings, attachments
and one turn of the conversation) imports ``api.js`` (the OpenAI client: fetch with
the key, error envelopes, the SSE stream of an answer) and ``messages.js`` (the
messages as drawn on the page). Each served file is listed in ``_FILES``.

Every file goes out with a Content-Security-Policy that allows scripts, styles
and connections from this server only (no inline script, no remote loads;
``data:`` images for attached-image previews) and ``X-Content-Type-Options:
nosniff``, so that model output, which the page renders as text, could not run
even if a future change let it reach the DOM as HTML.
"""

from __future__ import annotations

from importlib import resources

from kestrel_trio.http import Request, Response, Router

__all__ = ["PATHS", "add_webui_routes", "SECURITY_HEADERS"]

# path -> (file in this package, Content-Type)
_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/webui/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/webui/api.js": ("api.js", "text/javascript; charset=utf-8"),
    "/webui/messages.js": ("messages.js", "text/javascript; charset=utf-8"),
    "/webui/style.css": ("style.css", "text/css; charset=utf-8"),
    "/webui/icon.svg": ("icon.svg", "image/svg+xml"),
}
PATHS = frozenset(_FILES)

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = (
    ("content-security-policy", CONTENT_SECURITY_POLICY),
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "no-referrer"),
    ("cache-control", "no-cache"),  # revalidate, so an upgraded server's page is never mixed with an old script
)


def _load(name: str) -> bytes:
    return resources.files(__name__).joinpath(name).read_bytes()


def add_webui_routes(router: Router) -> None:
    """Serve the chat page's files on ``router`` (GET and HEAD), each read once from package data now.

    Raises:
        FileNotFoundError: the package was installed without its data files.
    """
    for path, (name, content_type) in _FILES.items():
        response = Response(status=200, body=_load(name), headers=SECURITY_HEADERS, content_type=content_type)

        def answer(request: Request, response: Response = response) -> Response:
            return response

        router.add_immediate("GET", path, answer)  # the router answers HEAD from GET
