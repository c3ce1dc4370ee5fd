"""``kestrel-trio chat`` on a real terminal: Ctrl-C stops an answer; readline edits lines and recalls earlier ones."""

from __future__ import annotations

import sys

import pytest
from pty_kit import Terminal

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")

CHAT = [sys.executable, "-m", "kestrel_trio.cli", "--log-level", "WARNING", "chat", "--no-think"]
LEFT, UP, BACKSPACE = b"\x1b[D", b"\x1b[A", b"\x7f"


def test_ctrl_c_stops_the_answer_and_the_chat_goes_on() -> None:
    terminal = Terminal(CHAT + ["--max-tokens", "8000", "--temperature", "1", "--seed", "7"])
    try:
        at = terminal.read_until(b">>> ")
        terminal.write(b"tell me a very long story\r")
        started = terminal.read_until(b"story", at)
        terminal.read_until(b" ", started + 200)  # the answer is being written
        terminal.write(b"\x03")  # Ctrl-C: the terminal sends SIGINT to the chat
        at = terminal.read_until(b"[stopped]")
        at = terminal.read_until(b">>> ", at)
        terminal.write(b"/exit\r")
        assert terminal.wait() == 0
    finally:
        terminal.close()


def test_arrow_keys_edit_the_line_and_recall_the_last_one() -> None:
    terminal = Terminal(CHAT + ["--max-tokens", "4", "--temperature", "0"])
    try:
        at = terminal.read_until(b">>> ")
        # "/hxlp", two steps left, delete the "x", type "e": only line editing makes that "/help".
        terminal.write(b"/hxlp" + LEFT + LEFT + BACKSPACE + b"e\r")
        at = terminal.read_until(b"commands:", at)
        at = terminal.read_until(b">>> ", at)
        terminal.write(UP + b"\r")  # the history's last line, /help, again
        at = terminal.read_until(b"commands:", at)
        at = terminal.read_until(b">>> ", at)
        terminal.write(b"/exit\r")
        assert terminal.wait() == 0
        assert b"^[[" not in terminal.seen  # no arrow key echoed as text
        assert b"unknown command" not in terminal.seen
    finally:
        terminal.close()
