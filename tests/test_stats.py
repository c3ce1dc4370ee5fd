"""Metrics and their Prometheus text exposition (0.0.4), checked by parsing the output back."""

from __future__ import annotations

import math
import re

import pytest

from kestrel_trio.stats import CONTENT_TYPE, Counter, Gauge, Histogram, render_prometheus

_SAMPLE = re.compile(r"(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(,|$)')


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "\\": "\\", '"': '"'}[m.group(1)], text)


def _parse_labels(text: str | None) -> dict[str, str]:
    labels: dict[str, str] = {}
    pos = 0
    while text and pos < len(text):
        match = _LABEL.match(text, pos)
        assert match, f"malformed labels {text!r} at {pos}"
        labels[match.group(1)] = _unescape(match.group(2))
        pos = match.end()
    return labels


def parse_exposition(text: str) -> dict:
    """Parse exposition text into {family: {"help", "type", "samples": [(name, labels, value)]}}, strictly."""
    assert text.endswith("\n")
    families: dict = {}
    current = None
    for line in text[:-1].split("\n"):
        if line.startswith("# HELP "):
            name, _, help_text = line[len("# HELP "):].partition(" ")
            assert name not in families, f"family {name} twice"
            current = families[name] = {"help": _unescape(help_text), "type": None, "samples": []}
        elif line.startswith("# TYPE "):
            name, _, kind = line[len("# TYPE "):].partition(" ")
            assert name in families and families[name]["type"] is None and not families[name]["samples"]
            assert kind in ("counter", "gauge", "histogram", "summary", "untyped")
            families[name]["type"] = kind
        else:
            match = _SAMPLE.fullmatch(line)
            assert match and current is not None, f"bad line {line!r}"
            value = match.group("value")
            assert value in ("+Inf", "-Inf", "NaN") or re.fullmatch(r"-?[0-9.e+-]+", value)
            current["samples"].append((match.group("name"), _parse_labels(match.group("labels")), float(value)))
    return families


def test_counter_with_and_without_labels():
    plain = Counter("kestrel:requests_total", "Requests served.")
    plain.inc()
    plain.inc(2.5)
    labelled = Counter("kestrel_tokens_total", "Tokens.", labelnames=("kind",))
    labelled.inc(3, kind="prompt")
    labelled.inc(kind="generated")
    labelled.inc(4, kind="prompt")
    families = parse_exposition(render_prometheus([plain, labelled]))
    assert families["kestrel:requests_total"] == {
        "help": "Requests served.", "type": "counter", "samples": [("kestrel:requests_total", {}, 3.5)],
    }
    assert families["kestrel_tokens_total"]["samples"] == [  # series sorted by label values
        ("kestrel_tokens_total", {"kind": "generated"}, 1.0),
        ("kestrel_tokens_total", {"kind": "prompt"}, 7.0),
    ]
    assert labelled.value(kind="prompt") == 7.0


def test_counter_rejects_decrease_and_wrong_labels():
    counter = Counter("c_total", "c", labelnames=("a",))
    with pytest.raises(ValueError):
        counter.inc(-1, a="x")
    with pytest.raises(ValueError):
        counter.inc(b="x")
    with pytest.raises(ValueError):
        counter.inc()


def test_gauge_set_inc_dec_and_callable():
    running = Gauge("kestrel:num_requests_running", "Requests running.")
    running.set(5)
    running.inc()
    running.dec(2)
    waiting_queue = [1, 2, 3]
    waiting = Gauge("kestrel:num_requests_waiting", "Requests queued.", function=lambda: len(waiting_queue))
    families = parse_exposition(render_prometheus([running, waiting]))
    assert families["kestrel:num_requests_running"]["samples"] == [("kestrel:num_requests_running", {}, 4.0)]
    assert families["kestrel:num_requests_waiting"]["type"] == "gauge"
    assert families["kestrel:num_requests_waiting"]["samples"][0][2] == 3.0
    waiting_queue.pop()
    assert parse_exposition(render_prometheus([waiting]))["kestrel:num_requests_waiting"]["samples"][0][2] == 2.0
    with pytest.raises(ValueError):
        Gauge("g", "g", labelnames=("a",), function=lambda: 1.0)


def test_histogram_buckets_are_cumulative_and_inclusive():
    histogram = Histogram("kestrel:e2e_request_latency_seconds", "Latency.", buckets=(0.1, 0.5, 1.0))
    observations = [0.05, 0.1, 0.3, 0.5, 0.7, 2.0, 3.0]
    for value in observations:
        histogram.observe(value)
    family = parse_exposition(render_prometheus([histogram]))["kestrel:e2e_request_latency_seconds"]
    assert family["type"] == "histogram"
    buckets = [(labels["le"], value) for name, labels, value in family["samples"] if name.endswith("_bucket")]
    assert [le for le, _ in buckets] == ["0.1", "0.5", "1.0", "+Inf"]
    for le, count in buckets:
        assert count == sum(1 for o in observations if o <= float(le))
    counts = [count for _, count in buckets]
    assert counts == sorted(counts)
    samples = {name: value for name, labels, value in family["samples"] if not name.endswith("_bucket")}
    assert samples["kestrel:e2e_request_latency_seconds_count"] == len(observations) == counts[-1]
    assert math.isclose(samples["kestrel:e2e_request_latency_seconds_sum"], sum(observations))


def test_histogram_with_labels_and_validation():
    histogram = Histogram("ttft_seconds", "TTFT.", buckets=[1.0, 2.0, float("inf")], labelnames=("model",))
    histogram.observe(1.5, model="a")
    histogram.observe(0.5, model="b")
    samples = parse_exposition(render_prometheus([histogram]))["ttft_seconds"]["samples"]
    assert ("ttft_seconds_bucket", {"model": "a", "le": "1.0"}, 0.0) in samples
    assert ("ttft_seconds_bucket", {"model": "a", "le": "2.0"}, 1.0) in samples
    assert ("ttft_seconds_bucket", {"model": "b", "le": "1.0"}, 1.0) in samples
    assert ("ttft_seconds_count", {"model": "b"}, 1.0) in samples
    assert sum(1 for name, labels, _ in samples if labels.get("le") == "+Inf") == 2
    for buckets in ([], [2.0, 1.0], [1.0, 1.0], [float("nan")]):
        with pytest.raises(ValueError):
            Histogram("h", "h", buckets=buckets)
    with pytest.raises(ValueError):
        Histogram("h", "h", buckets=[1.0], labelnames=("le",))


def test_escaping_of_label_values_and_help():
    counter = Counter("weird_total", 'Help with \\ backslash\nand newline "quotes"', labelnames=("path",))
    nasty = 'a "quoted" \\ back\nslash, comma=} brace'
    counter.inc(path=nasty)
    text = render_prometheus([counter])
    assert len([line for line in text.splitlines() if line.startswith("weird_total")]) == 1
    family = parse_exposition(text)["weird_total"]
    assert family["help"] == 'Help with \\ backslash\nand newline "quotes"'
    assert family["samples"] == [("weird_total", {"path": nasty}, 1.0)]


@pytest.mark.parametrize("name", ["1abc", "a-b", "", "a b", "é"])
def test_invalid_metric_names_are_rejected(name):
    with pytest.raises(ValueError):
        Counter(name, "x")


@pytest.mark.parametrize("label", ["1a", "a:b", "__reserved", "a-b"])
def test_invalid_label_names_are_rejected(label):
    with pytest.raises(ValueError):
        Gauge("g", "x", labelnames=(label,))


def test_render_details():
    assert render_prometheus([]) == ""
    assert "version=0.0.4" in CONTENT_TYPE
    with pytest.raises(ValueError):
        render_prometheus([Counter("same", "a"), Gauge("same", "b")])
    special = Gauge("special", "s")
    special.set(float("inf"))
    assert "special +Inf\n" in render_prometheus([special])
    special.set(float("nan"))
    assert "special NaN\n" in render_prometheus([special])
