"""Typed access to fields of a decoded JSON request body.

Every accessor takes the containing object, the key, and the dotted path of
that object (``""`` at top level) so that a :class:`BadRequestError` can name
the offending field exactly (``messages[2].content``). ``null`` and a missing
key both mean "unset" and yield ``None``. JSON ``true``/``false`` are never
accepted as numbers, and integers are accepted where numbers are.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from kestrel_trio.errors import BadRequestError

__all__ = [
    "load_object",
    "json_type_name",
    "join_path",
    "fail",
    "get_str",
    "get_bool",
    "get_int",
    "get_number",
    "get_object",
    "get_array",
    "require",
    "check_int",
    "check_token_id",
    "check_str",
    "check_object",
]


def load_object(body: bytes) -> dict:
    """Decode a request body that must be a JSON object.

    Args:
        body: the raw HTTP request body (UTF-8 JSON).

    Returns:
        The decoded top-level object.

    Raises:
        BadRequestError: the body is not valid UTF-8 JSON (``param`` None), or
            it is valid JSON but not an object.
    """
    try:
        # Decode first: json.loads(bytes) would also sniff and accept UTF-16/32.
        value = json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise BadRequestError(f"Request body is not valid JSON: {exc}", param=None) from None
    if not isinstance(value, dict):
        raise BadRequestError(f"Request body must be a JSON object, got {json_type_name(value)}", param=None)
    if _SURROGATE_ESCAPE.search(body):
        _refuse_lone_surrogates(value, "")
    return value


# JSON may spell half of a UTF-16 surrogate pair alone ("\ud800"): valid JSON, but no Unicode text.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


def _refuse_lone_surrogates(value: Any, path: str) -> None:
    """BadRequestError naming the first string (or key) that is not encodable Unicode text."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequestError(f"'{path or 'body'}' holds a lone UTF-16 surrogate escape; send valid Unicode text",
                                  param=path or None) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _refuse_lone_surrogates(key, path)
            _refuse_lone_surrogates(item, join_path(path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _refuse_lone_surrogates(item, join_path(path, index))


def _reject_constant(name: str) -> float:
    # NaN / Infinity / -Infinity are not JSON; Python's decoder accepts them by default.
    raise ValueError(f"{name} is not allowed in JSON")


def json_type_name(value: Any) -> str:
    """The JSON type name of a decoded value: object, array, string, integer, number, boolean or null."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def join_path(path: str, key: str | int) -> str:
    """The dotted path of ``key`` inside the field at ``path`` (``a.b``, ``a[3]``)."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def fail(path: str, expected: str, value: Any) -> BadRequestError:
    """A type error for the field at ``path``: "'path' must be <expected>, got <type>"."""
    return BadRequestError(f"'{path}' must be {expected}, got {json_type_name(value)}", param=path)


def require(obj: dict, key: str, path: str = "") -> Any:
    """The value of a required field (present and not null)."""
    value = obj.get(key)
    if value is None:
        field = join_path(path, key)
        raise BadRequestError(f"'{field}' is required", param=field)
    return value


def check_int(value: Any, path: str) -> int:
    """``value`` if it is a JSON integer (not a boolean, not 1.0)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(path, "an integer", value)
    return value


_MAX_TOKEN_ID = 2**31 - 1  # far above any vocabulary; the model checks its own size later


def check_token_id(value: Any, path: str) -> int:
    """``value`` if it is a JSON integer in 0..2**31-1."""
    token = check_int(value, path)
    if not 0 <= token <= _MAX_TOKEN_ID:
        raise BadRequestError(f"'{path}' must be a non-negative token id (at most {_MAX_TOKEN_ID}), got {token}",
                              param=path)
    return token


def check_str(value: Any, path: str) -> str:
    """``value`` if it is a JSON string."""
    if not isinstance(value, str):
        raise fail(path, "a string", value)
    return value


def check_object(value: Any, path: str) -> dict:
    """``value`` if it is a JSON object."""
    if not isinstance(value, dict):
        raise fail(path, "an object", value)
    return value


def get_str(obj: dict, key: str, path: str = "") -> str | None:
    """An optional string field."""
    value = obj.get(key)
    return None if value is None else check_str(value, join_path(path, key))


def get_bool(obj: dict, key: str, path: str = "") -> bool | None:
    """An optional boolean field."""
    value = obj.get(key)
    if value is None or isinstance(value, bool):
        return value
    raise fail(join_path(path, key), "a boolean", value)


def get_int(obj: dict, key: str, path: str = "") -> int | None:
    """An optional integer field."""
    value = obj.get(key)
    return None if value is None else check_int(value, join_path(path, key))


def get_number(obj: dict, key: str, path: str = "") -> float | None:
    """An optional number field; integers are converted to float."""
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(join_path(path, key), "a number", value)
    try:
        result = float(value)
    except OverflowError:  # an integer literal too large for a double
        result = math.inf
    if not math.isfinite(result):
        field = join_path(path, key)
        raise BadRequestError(f"'{field}' must be a finite number", param=field)
    return result


def get_object(obj: dict, key: str, path: str = "") -> dict | None:
    """An optional object field."""
    value = obj.get(key)
    return None if value is None else check_object(value, join_path(path, key))


def get_array(obj: dict, key: str, path: str = "") -> list | None:
    """An optional array field."""
    value = obj.get(key)
    if value is None or isinstance(value, list):
        return value
    raise fail(join_path(path, key), "an array", value)
