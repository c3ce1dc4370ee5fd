"""Shared by the HTTP fuzzers: real requests with a few byte-level edits, and a strict reader of the answers."""

from __future__ import annotations

from typing import Sequence

import h11
from hypothesis import strategies as st


def mutated(valid: bytes, *, max_edits: int, bytes_tried: Sequence[int], max_duplicate: int) -> st.SearchStrategy:
    """``valid`` with 1 to ``max_edits`` inserts, replacements, deletions, truncations or duplicated runs.

    Args:
        valid: well-formed request bytes to start from.
        max_edits: edits per example.
        bytes_tried: bytes favoured for inserts and replacements (any byte may still be drawn).
        max_duplicate: longest run of bytes repeated in place.
    """

    @st.composite
    def strategy(draw) -> bytes:
        data = bytearray(valid)
        for _ in range(draw(st.integers(1, max_edits))):
            position = draw(st.integers(0, len(data)))
            operation = draw(st.sampled_from(["insert", "replace", "delete", "truncate", "duplicate"]))
            byte = draw(st.sampled_from(list(bytes_tried)) | st.integers(0, 255))
            if operation == "insert":
                data.insert(position, byte)
            elif operation == "replace" and position < len(data):
                data[position] = byte
            elif operation == "delete" and position < len(data):
                del data[position]
            elif operation == "truncate":
                del data[position:]
            elif operation == "duplicate":
                data[position:position] = data[position : position + draw(st.integers(1, max_duplicate))]
        return bytes(data)

    return strategy()


def parse_responses(data: bytes) -> list[int]:
    """Statuses of the complete, well-formed responses that make up ``data`` exactly (raises otherwise)."""
    statuses = []
    while data:
        parser = h11.Connection(h11.CLIENT)
        parser.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
        parser.send(h11.EndOfMessage())
        parser.receive_data(data)
        parser.receive_data(b"")  # what we got is all there is
        while True:
            event = parser.next_event()  # raises on malformed or truncated responses
            if isinstance(event, h11.Response):
                statuses.append(event.status_code)
            if isinstance(event, h11.EndOfMessage):
                break
        data = parser.trailing_data[0]
    return statuses
