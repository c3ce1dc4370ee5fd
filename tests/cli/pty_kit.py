"""A child process on a pseudo-terminal, as a user's terminal runs it (POSIX only)."""

from __future__ import annotations

import os
import pty
import select
import signal
import time
import warnings

BUDGET = 120.0  # s, absolute for the whole conversation


class Terminal:
    """A child process on a pseudo-terminal, read until a marker or the budget's end."""

    def __init__(self, argv: list[str]) -> None:
        with warnings.catch_warnings():
            # Python 3.12+ warns about fork() in a process with threads; the child execs at once.
            warnings.simplefilter("ignore", DeprecationWarning)
            self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: become the command, its terminal the pty
            # Ctrl-C's SIGINT as a terminal's foreground job has it: a test run started as a background job
            # (``cmd &`` in a script) ignores SIGINT, the child would inherit that, and Python then installs no
            # KeyboardInterrupt handler (measured: the chat answered on past Ctrl-C to the end of its context).
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execv(argv[0], argv)
        self.seen = b""
        self.deadline = time.monotonic() + BUDGET

    def read_until(self, marker: bytes, after: int = 0) -> int:
        """Read until ``marker`` appears past offset ``after``; the offset just past it."""
        while (found := self.seen.find(marker, after)) < 0:
            left = self.deadline - time.monotonic()
            assert left > 0, f"no {marker!r} in time; the terminal shows: {self.seen[-500:]!r}"
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:  # the child closed the terminal
                    chunk = b""
                assert chunk, f"the terminal closed before {marker!r}; it showed: {self.seen[-500:]!r}"
                self.seen += chunk
        return found + len(marker)

    def write(self, data: bytes) -> None:
        os.write(self.fd, data)

    def wait(self) -> int:
        while time.monotonic() < self.deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            try:  # keep draining so the child never blocks on a full terminal
                if select.select([self.fd], [], [], 0.05)[0]:
                    self.seen += os.read(self.fd, 65536)
            except OSError:
                pass
        os.kill(self.pid, 9)
        raise AssertionError("the chat did not exit in time")

    def close(self) -> None:
        """Kill the child if it still runs, reap it, and close the terminal."""
        try:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(self.fd)
