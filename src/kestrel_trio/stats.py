"""Minimal metrics with Prometheus text exposition (format 0.0.4).

Pure Python and thread-safe (a lock per metric), so engine worker threads and
the trio thread may both update them. Metric names may contain colons, as in
vLLM's ``vllm:num_requests_running``.
"""

from __future__ import annotations

import bisect
import math
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

__all__ = ["Counter", "Gauge", "Histogram", "render_prometheus", "DEFAULT_LATENCY_BUCKETS", "CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

LabelValues = tuple[str, ...]


class _Metric:
    """Shared parts: name, help text, label names and a series per label-value tuple."""

    kind = "untyped"

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        if not _METRIC_NAME.fullmatch(name):
            raise ValueError(f"invalid metric name {name!r}")
        for label in labelnames:
            if not _LABEL_NAME.fullmatch(label) or label.startswith("__"):
                raise ValueError(f"invalid label name {label!r} for metric {name!r}")
        self.name = name
        self.help = help
        self.labelnames = tuple(labelnames)
        self._lock = threading.Lock()

    def _key(self, labels: Mapping[str, str]) -> LabelValues:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"metric {self.name!r} takes labels {self.labelnames}, got {tuple(labels)}")
        return tuple(str(labels[name]) for name in self.labelnames)

    def samples(self) -> list[tuple[str, dict[str, str], float]]:
        """``(sample name, labels, value)`` triples to expose."""
        raise NotImplementedError


class Counter(_Metric):
    """A monotonically increasing count (requests, tokens).

    Args:
        name: metric name (conventionally ending in ``_total``).
        help: one-line description.
        labelnames: names of the labels each ``inc`` must give.
    """

    kind = "counter"

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, help, labelnames)
        self._values: dict[LabelValues, float] = {} if labelnames else {(): 0.0}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        """Add ``amount`` (>= 0) to the series named by ``labels``."""
        if amount < 0:
            raise ValueError(f"counter {self.name!r} cannot decrease (inc by {amount})")
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        """The current value of one series (0 if never incremented)."""
        key = self._key(labels)
        with self._lock:
            return self._values.get(key, 0.0)

    def samples(self) -> list[tuple[str, dict[str, str], float]]:
        with self._lock:
            items = sorted(self._values.items())
        return [(self.name, dict(zip(self.labelnames, key)), value) for key, value in items]


class Gauge(_Metric):
    """A value that goes up and down, set directly or read from a callable at render time.

    Args:
        name: metric name.
        help: one-line description.
        labelnames: names of the labels each ``set`` must give.
        function: if given (unlabelled gauges only), called at every render for the value.
    """

    kind = "gauge"

    def __init__(
        self,
        name: str,
        help: str,
        labelnames: Sequence[str] = (),
        function: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(name, help, labelnames)
        if function is not None and labelnames:
            raise ValueError(f"gauge {name!r}: a callable value cannot have labels")
        self._function = function
        self._values: dict[LabelValues, float] = {} if labelnames else {(): 0.0}

    def set(self, value: float, **labels: str) -> None:
        """Set the series named by ``labels`` to ``value``."""
        key = self._key(labels)
        with self._lock:
            self._values[key] = float(value)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        """Add ``amount`` (may be negative) to the series named by ``labels``."""
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def dec(self, amount: float = 1.0, **labels: str) -> None:
        """Subtract ``amount`` from the series named by ``labels``."""
        self.inc(-amount, **labels)

    def value(self, **labels: str) -> float:
        """The current value of one series."""
        if self._function is not None:
            return float(self._function())
        key = self._key(labels)
        with self._lock:
            return self._values.get(key, 0.0)

    def samples(self) -> list[tuple[str, dict[str, str], float]]:
        if self._function is not None:
            return [(self.name, {}, float(self._function()))]
        with self._lock:
            items = sorted(self._values.items())
        return [(self.name, dict(zip(self.labelnames, key)), value) for key, value in items]


class Histogram(_Metric):
    """A distribution of observations (latencies in seconds) over fixed buckets.

    Args:
        name: metric name.
        help: one-line description.
        buckets: strictly increasing finite upper bounds; ``+Inf`` is added.
        labelnames: names of the labels each ``observe`` must give (never ``le``).
    """

    kind = "histogram"

    def __init__(
        self,
        name: str,
        help: str,
        buckets: Sequence[float] = DEFAULT_LATENCY_BUCKETS,
        labelnames: Sequence[str] = (),
    ) -> None:
        super().__init__(name, help, labelnames)
        if "le" in self.labelnames:
            raise ValueError(f"histogram {name!r}: 'le' is a reserved label")
        bounds = [float(b) for b in buckets if not (math.isinf(b) and b > 0)]
        if not bounds or any(not math.isfinite(b) for b in bounds) or any(a >= b for a, b in zip(bounds, bounds[1:])):
            raise ValueError(f"histogram {name!r}: buckets must be finite and strictly increasing, got {buckets}")
        self.bounds = tuple(bounds)
        # per series: [count per bucket (non-cumulative, last is +Inf)], sum
        self._series: dict[LabelValues, tuple[list[int], list[float]]] = {}
        if not labelnames:
            self._series[()] = self._new_series()

    def _new_series(self) -> tuple[list[int], list[float]]:
        return [0] * (len(self.bounds) + 1), [0.0]

    def observe(self, value: float, **labels: str) -> None:
        """Record one observation (seconds, for latency histograms)."""
        key = self._key(labels)
        index = bisect.bisect_left(self.bounds, value)  # bucket bounds are inclusive ("le")
        with self._lock:
            counts, total = self._series.setdefault(key, self._new_series())
            counts[index] += 1
            total[0] += value

    def samples(self) -> list[tuple[str, dict[str, str], float]]:
        with self._lock:
            items = sorted((key, (list(counts), total[0])) for key, (counts, total) in self._series.items())
        out = []
        for key, (counts, total) in items:
            labels = dict(zip(self.labelnames, key))
            running = 0
            for bound, count in zip((*self.bounds, math.inf), counts):
                running += count
                out.append((f"{self.name}_bucket", {**labels, "le": _format_value(bound)}, float(running)))
            out.append((f"{self.name}_sum", labels, total))
            out.append((f"{self.name}_count", labels, float(running)))
        return out


def render_prometheus(metrics: Iterable[_Metric]) -> str:
    """Render metrics in the Prometheus text exposition format 0.0.4.

    Args:
        metrics: the metrics to expose, each with a distinct name.

    Raises:
        ValueError: two metrics share a name.

    Returns:
        The exposition text (``# HELP``, ``# TYPE`` and sample lines), ending
        with a newline; serve it with :data:`CONTENT_TYPE`.
    """
    lines = []
    seen: set[str] = set()
    for metric in metrics:
        if metric.name in seen:
            raise ValueError(f"metric {metric.name!r} is rendered twice")
        seen.add(metric.name)
        lines.append(f"# HELP {metric.name} {_escape_help(metric.help)}")
        lines.append(f"# TYPE {metric.name} {metric.kind}")
        for name, labels, value in metric.samples():
            lines.append(f"{name}{_format_labels(labels)} {_format_value(value)}")
    return "\n".join(lines) + "\n" if lines else ""


def _format_labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{name}="{_escape_label_value(value)}"' for name, value in labels.items()) + "}"


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))
