"""Budgets a JSON schema must keep before llguidance compiles it: item counts, nesting depth, size.

llguidance's own limits (``LLParserLimits``: grammar size, lexer and parser
fuel) are checked only after its JSON compiler has expanded a schema into
grammar rules, and that expansion is where one request can exhaust the host:
an array's ``minItems`` / ``maxItems`` is unrolled into that many grammar
symbols (measured with llguidance 1.6 on the 2-core Zen 3: ``maxItems``
10^5 took 125 MB and 0.3 s, 10^6 took 1.1 GB before the grammar-size limit
refused it, and 10^9 aborts the process). Strings (``minLength`` /
``maxLength``, ``pattern`` counts) and Lark repetitions are lazy lexer
states and cost nothing up front; they stay under llguidance's fuel limits.

So a schema is walked here first, iteratively (a deep schema must not
recurse through Python's stack either), and refused with a 400 naming the
keyword's path when:

* an item count (``minItems``, ``maxItems``, ``minContains``, ``maxContains``)
  exceeds :data:`MAX_ITEMS`, or the counts of one request add up past
  :data:`MAX_TOTAL_ITEMS` (each unrolled item is grammar the compiler builds);
* objects and arrays nest deeper than :data:`MAX_DEPTH`;
* the schema holds more than :data:`MAX_NODES` objects, arrays and values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kestrel_trio.errors import BadRequestError

__all__ = ["MAX_ITEMS", "MAX_TOTAL_ITEMS", "MAX_DEPTH", "MAX_NODES", "ITEM_KEYWORDS", "check_schema_budget"]

MAX_ITEMS = 4096  # one array's unrolled item bound (maxItems 4096: about 0.1 s of compilation)
MAX_TOTAL_ITEMS = 16384  # the item bounds of every array of a request's schemas, added up
MAX_DEPTH = 64  # nesting of JSON objects and arrays inside one schema (OpenAI's strict mode allows 10)
MAX_NODES = 100_000  # objects, arrays and values inside one schema
ITEM_KEYWORDS = ("minItems", "maxItems", "minContains", "maxContains")


def check_schema_budget(schema: Any, param: str, *, spent: int = 0) -> int:
    """Refuse a schema over budget (see module doc); return the item count it adds to ``spent``.

    Args:
        schema: the JSON schema as decoded from the request.
        param: its request path (``response_format.json_schema.schema``), the start of every error's path.
        spent: item counts already used by other schemas of the same request.

    Returns:
        ``spent`` plus this schema's item counts.

    Raises:
        BadRequestError: naming the path of the keyword (or the too-deep value) at fault.
    """
    nodes = 0
    pending: list[tuple[Any, str, int]] = [(schema, param, 0)]
    while pending:
        value, path, depth = pending.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise BadRequestError(f"'{param}': the schema has more than {MAX_NODES} objects, arrays and values, "
                                  "more than structured outputs compile", param=param)
        if isinstance(value, Mapping):
            children = [(v, f"{path}.{k}") for k, v in value.items()]
            for keyword in ITEM_KEYWORDS:
                count = value.get(keyword)
                if isinstance(count, (int, float)) and not isinstance(count, bool):
                    where = f"{path}.{keyword}"
                    if count > MAX_ITEMS:
                        raise BadRequestError(f"'{where}': {keyword} {count} is more than structured outputs "
                                              f"compile (at most {MAX_ITEMS} items per array)", param=where)
                    spent += max(0, int(count))
                    if spent > MAX_TOTAL_ITEMS:
                        raise BadRequestError(f"'{where}': the item counts (minItems, maxItems...) of this "
                                              f"request's schemas add up to more than {MAX_TOTAL_ITEMS}, more "
                                              "than structured outputs compile", param=where)
        elif isinstance(value, list):
            children = [(v, f"{path}[{i}]") for i, v in enumerate(value)]
        else:
            continue
        if depth >= MAX_DEPTH and children:
            raise BadRequestError(f"'{path}': the schema nests objects and arrays more than {MAX_DEPTH} deep, "
                                  "deeper than structured outputs compile", param=path)
        pending.extend((child, child_path, depth + 1) for child, child_path in children)
    return spent
