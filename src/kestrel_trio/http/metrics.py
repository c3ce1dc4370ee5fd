"""The HTTP layer's Prometheus metrics: connections and the requests it refused itself."""

from __future__ import annotations

from typing import Callable

from kestrel_trio.stats import Counter, Gauge, render_prometheus

__all__ = ["HttpMetrics"]


class HttpMetrics:
    """Counters the connections update; rendered beside the engine's on /metrics.

    Args:
        open_connections: returns the number of connections being served now.
    """

    def __init__(self, open_connections: Callable[[], float]) -> None:
        self.open = Gauge("kestrel:http_connections_open", "Connections being served now.", function=open_connections)
        self.accepted = Counter("kestrel:http_connections_total", "Connections accepted, turned-away ones included.")
        self.turned_away = Counter(
            "kestrel:http_connections_turned_away_total",
            "Connections over max_connections: answered 503, or dropped unanswered in a flood.", ["answer"],
        )
        self.refused = Counter(
            "kestrel:http_requests_refused_total",
            "Requests the HTTP layer answered itself with an error (timeouts, sizes, malformed input).", ["code"],
        )

    def render(self) -> str:
        """Prometheus text exposition of every HTTP metric."""
        return render_prometheus([self.open, self.accepted, self.turned_away, self.refused])
