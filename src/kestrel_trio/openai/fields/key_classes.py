"""The one loop that sorts a request object's keys into acting, no-op, refused and unknown.

Every API front (chat completions, Responses, Anthropic Messages) holds its own tables of documented no-op
fields and refused fields; what it does with a key is the same everywhere and lives here:

* acting (read by the parser, which passes its own set): passed over;
* a no-op: its value, unless ``null``, must pass the field's check;
* refused: unless ``null``, a 400 whose ``param`` names it and whose message gives the reason;
* unknown: a 400 in the front's own words (``unknown(full_path)``), whatever the value.

Also the small value checks the no-op tables share.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping
from typing import Any

from kestrel_trio.errors import BadRequestError
from kestrel_trio.openai.fields.access import check_object, check_str, fail, join_path

__all__ = ["Check", "classify_keys", "checks_of", "refused", "is_string", "is_object", "is_boolean", "is_array", "one_of"]

# check(value, path) raises BadRequestError for a value the field does not accept.
Check = Callable[[Any, str], None]


def classify_keys(obj: dict, acting: Collection[str], *, no_op: Callable[[str], Check | None],
                  refused_fields: Mapping[str, str], unknown: Callable[[str], str], path: str = "",
                  generic: str = "") -> None:
    """Refuse every key of ``obj`` that is neither acting, an accepted no-op, nor null and known.

    Args:
        obj: a decoded request object (the body, or an object nested in it).
        acting: the keys its parser reads.
        no_op: the value check of a no-op field given its generic path, ``None`` for a field that is not one.
        refused_fields: generic path -> why the field is refused.
        unknown: the message for an unknown key given its full path.
        path: ``obj``'s dotted path in the body (``messages[2]``), ``""`` at top level.
        generic: the same path in generic form (``messages[]``).

    Raises:
        BadRequestError: naming the first offending key (``param`` its full path).
    """
    for key, value in obj.items():
        if key in acting:
            continue
        field = join_path(generic, key)
        full = join_path(path, key)
        check = no_op(field)
        if check is not None:
            if value is not None:
                check(value, full)
            continue
        if field in refused_fields:
            if value is not None:
                raise refused(full, refused_fields[field])
            continue
        raise BadRequestError(unknown(full), param=full)


def checks_of(no_op_fields: Mapping[str, tuple[str, str, Check]]) -> Callable[[str], Check | None]:
    """The ``no_op`` argument of :func:`classify_keys` for a table: generic path -> (accepts, why, check)."""
    def check_of(field: str) -> Check | None:
        entry = no_op_fields.get(field)
        return None if entry is None else entry[2]

    return check_of


def refused(full: str, reason: str) -> BadRequestError:
    """The 400 refusing the field at ``full``: ``'full' is ...`` when the reason reads on, else ``'full': reason``."""
    return BadRequestError(f"'{full}' {reason}" if reason.startswith("is ") else f"'{full}': {reason}", param=full)


def is_string(value: Any, path: str) -> None:
    """Accept a JSON string."""
    check_str(value, path)


def is_object(value: Any, path: str) -> None:
    """Accept a JSON object."""
    check_object(value, path)


def is_boolean(value: Any, path: str) -> None:
    """Accept ``true`` or ``false``."""
    if not isinstance(value, bool):
        raise fail(path, "a boolean", value)


def is_array(value: Any, path: str) -> None:
    """Accept a JSON array (its items unchecked)."""
    if not isinstance(value, list):
        raise fail(path, "an array", value)


def one_of(*accepted: Any) -> Check:
    """A check accepting exactly the ``accepted`` JSON values (``1`` is not ``true``), naming them when refusing."""

    def check(value: Any, path: str) -> None:
        if not any(type(value) is type(good) and value == good for good in accepted):
            wanted = ", ".join(json.dumps(good) for good in accepted)
            raise BadRequestError(f"'{path}' must be one of {wanted}; got {json.dumps(value)}", param=path)

    return check
