"""The app layer: the OpenAI-compatible routes, HTTP requests in, engine generations, JSON or SSE out.

At the top, what every route shares: ``routes`` builds the router (the API-key check, the OpenAI routes and
the chat preparation every front reuses); ``state`` is what every route reads; ``streams`` the streamed
bodies over engine generations; ``envelopes`` the handlers answering in another API's error envelope. The
other fronts: ``responses`` (OpenAI's Responses API), ``messages`` (Anthropic's Messages API) and
``embeddings`` (``/v1/embeddings``). The rooms: ``chat`` (a request's n choices run as one job, its
grammar and its reasoning), ``media`` (a chat request's images and videos) and ``ollama`` (Ollama's API).
"""

from kestrel_trio.app.media.images import ImagePolicy
from kestrel_trio.app.media.videos import VideoPolicy
from kestrel_trio.app.routes import build_router
from kestrel_trio.app.state import OPEN_PATHS, ServerState

__all__ = ["ImagePolicy", "OPEN_PATHS", "ServerState", "VideoPolicy", "build_router"]
