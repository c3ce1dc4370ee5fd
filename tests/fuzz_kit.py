"""Hypothesis strategies shared by the HTTP fuzzers: real requests with a few byte-level edits."""

from __future__ import annotations

from typing import Sequence

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
