"""Is a text the start of some JSON document? An independent check (no grammar engine) for truncated outputs.

:func:`is_json_prefix` completes the text the shortest plausible way (close an
open string or escape, finish a number or literal, give a dangling key a
value, close every open container) and asks Python's own ``json`` module.
"""

from __future__ import annotations

import json
import re

__all__ = ["is_json_prefix"]

_LITERALS = ("true", "false", "null")


def is_json_prefix(text: str) -> bool:
    """Whether ``text`` can be extended into one valid JSON value (a complete value counts)."""
    if not text.strip():
        return True
    completion = _completion(text)
    if completion is None:
        return False
    try:
        json.loads(text + completion)
    except ValueError:
        return False
    return True


def _completion(text: str) -> str | None:
    stack: list[str] = []  # "{" or "["
    expect_key = False  # inside an object, where the next string is a key
    in_string = key_string = escaped = False
    after_key = False  # a key string closed, its ":" not seen yet
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
                after_key = key_string
            continue
        if ch == '"':
            in_string, key_string = True, expect_key and bool(stack) and stack[-1] == "{"
            expect_key = False
        elif ch in "{[":
            stack.append(ch)
            expect_key = ch == "{"
        elif ch in "}]":
            if not stack or stack.pop() != {"}": "{", "]": "["}[ch]:
                return None
            expect_key = False
        elif ch == ",":
            expect_key = bool(stack) and stack[-1] == "{"
        elif ch == ":":
            after_key = False
    suffix = ""
    if in_string:
        partial_escape = re.search(r"\\u[0-9a-fA-F]{0,3}$", text)
        if partial_escape:
            suffix += "0" * (6 - len(partial_escape.group()))
        elif escaped:
            suffix += "n"
        suffix += '"'
        after_key = key_string
    tail = (text + suffix).rstrip()
    if after_key:
        suffix += ": null"
    elif tail.endswith(":") or (tail.endswith(",") and stack and stack[-1] == "["):
        suffix += "null"
    elif tail.endswith(",") and stack and stack[-1] == "{":
        suffix += '"k": null'
    elif re.search(r"[-+.eE]$", tail):
        suffix += "0"
    else:
        word = re.search(r"[a-z]+$", tail)
        if word:
            literal = next((lit for lit in _LITERALS if lit.startswith(word.group())), None)
            if literal is None:
                return None
            suffix += literal[len(word.group()):]
    return suffix + "".join("}" if c == "{" else "]" for c in reversed(stack))


def test_the_checker_itself():  # collected where this module is imported into a test file
    for good in ('{', '{"a', '{"a"', '{"a": ', '{"a": "x', '{"a": [1, 2', '{"a": tr', '{"a": -', '{"a": 1.',
                 '{"a": 1e', '{"a": "\\', '{"a": "\\u00', '{"a": {}, ', '[1, ', '{"a": 1}', '"x"'):
        assert is_json_prefix(good), good
    for bad in ('}', '{"a": 1}}', '{"a" 1', '{"a": x', '{1', '[1 2', '{"a": 1} x', 'nul1'):
        assert not is_json_prefix(bad), bad
