"""Load progress: a bar on a terminal, periodic log lines elsewhere; ``serve`` shows it as ``generate`` does."""

from __future__ import annotations

import io
import logging
import re
import signal
import sys

import pytest
from cli_kit import CLI, FIXTURE, start_serve, stop
from pty_kit import Terminal

from kestrel_trio.cli.progress import LoadProgress, checkpoint_bytes


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "kestrel_trio.load"]


def test_off_a_terminal_it_logs_the_start_then_at_most_one_line_per_interval_then_the_end(caplog):
    caplog.set_level(logging.INFO, logger="kestrel_trio.load")
    clock, stream = FakeClock(), io.StringIO()
    progress = LoadProgress("loading weights", total_bytes=4 * 2**30, stream=stream, interval=5.0, clock=clock)
    assert not progress.interactive  # a StringIO is no terminal
    for elapsed, fraction in ((0.0, 0.1), (1.0, 0.2), (4.9, 0.3), (5.0, 0.5), (9.0, 0.6), (10.5, 0.75), (11.0, 1.0),
                              (12.0, 1.0)):
        clock.now = 100.0 + elapsed
        progress(fraction)
    assert _messages(caplog) == [
        "loading weights: 10% (409.6 MiB of 4.0 GiB) after 0.0 s",
        "loading weights: 50% (2.0 GiB of 4.0 GiB) after 5.0 s",
        "loading weights: 75% (3.0 GiB of 4.0 GiB) after 10.5 s",
        "loading weights: 100% (4.0 GiB) in 11.0 s",
    ]
    assert stream.getvalue() == ""  # nothing drawn


def test_without_a_size_it_logs_percent_and_time(caplog):
    caplog.set_level(logging.INFO, logger="kestrel_trio.load")
    clock = FakeClock()
    progress = LoadProgress("building demo weights", stream=io.StringIO(), clock=clock)
    progress(0.0)
    clock.now += 0.25
    progress(1.0)
    assert _messages(caplog) == ["building demo weights: 0% after 0.0 s", "building demo weights: 100% in 0.2 s"]


def test_on_a_terminal_it_redraws_one_line_and_ends_it(caplog):
    caplog.set_level(logging.INFO, logger="kestrel_trio.load")
    clock, stream = FakeClock(), io.StringIO()
    progress = LoadProgress("loading weights", total_bytes=2**20, stream=stream, interactive=True, clock=clock,
                            bar_width=10)
    for fraction in (0.5, 0.501, 1.0):
        progress(fraction)
        clock.now += 1.0
    drawn = stream.getvalue()
    assert drawn.split("\r")[1:] == [
        "loading weights [#####     ]  50%  512.0 KiB of 1.0 MiB  0.0 s",  # 50.1% is still 50%: not redrawn
        "loading weights [##########] 100%  1.0 MiB of 1.0 MiB  2.0 s  \n",  # padded to cover the longer line
    ]
    assert _messages(caplog) == []


def test_a_bar_left_unfinished_gets_its_line_ended_by_close():
    stream = io.StringIO()
    progress = LoadProgress("loading weights", stream=stream, interactive=True)
    progress(0.3)
    progress.close()
    progress.close()
    assert stream.getvalue().endswith("%  0.0 s\n") and stream.getvalue().count("\n") == 1


def test_checkpoint_bytes_counts_the_safetensors_files(tmp_path):
    assert checkpoint_bytes(FIXTURE) == (FIXTURE / "model.safetensors").stat().st_size
    assert checkpoint_bytes(tmp_path) is None and checkpoint_bytes(None) is None


def test_serve_logs_its_load_progress_off_a_terminal():
    process, _url, lines = start_serve("--model", str(FIXTURE))
    try:
        load_lines = [line.rstrip("\n") for line in lines if "kestrel_trio.load: loading weights:" in line]
        size = (FIXTURE / "model.safetensors").stat().st_size / 1024
        assert load_lines, "".join(lines)
        assert re.search(rf"INFO kestrel_trio.load: loading weights: 100% \({size:.1f} KiB\) in \d+\.\d s$",
                         load_lines[-1])
        assert not any("\r" in line for line in lines)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        stop(process)


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
def test_serve_draws_a_load_bar_on_a_terminal():
    terminal = Terminal(CLI + ["serve", "--port", "0", "--model", str(FIXTURE)])
    try:
        at = terminal.read_until(b"\rloading weights [")
        at = terminal.read_until(b"] 100%", at)
        terminal.read_until(b"kestrel-trio: serving", at)
        terminal.write(b"\x03")  # Ctrl-C: a graceful shutdown
        assert terminal.wait() == 0
    finally:
        terminal.close()
