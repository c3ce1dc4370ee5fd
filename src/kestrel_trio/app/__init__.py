"""The app layer: the OpenAI-compatible routes, HTTP requests in, engine generations, JSON or SSE out.

``routes`` builds the router; ``chat`` answers one chat or completions request
(n choices); ``images``, ``grammar`` and ``thinking`` prepare a chat request's images, its
structured-output constraint and its reasoning; ``state`` is what every route reads.
"""

from kestrel_trio.app.images import ImagePolicy
from kestrel_trio.app.videos import VideoPolicy
from kestrel_trio.app.routes import build_router
from kestrel_trio.app.state import OPEN_PATHS, ServerState

__all__ = ["ImagePolicy", "OPEN_PATHS", "ServerState", "VideoPolicy", "build_router"]
