"""``POST /v1/embeddings``: the request's fields validated, the response's JSON built (no trio, no numpy).

The body as OpenAI's API defines it: ``input`` (a string, an array of strings, an array of token ids, or an
array of such arrays), ``model``, ``dimensions`` (the vector is cut to its first ``dimensions`` values and
renormalized: what a Matryoshka-trained model such as Qwen3-Embedding allows), ``encoding_format``
(``float``, or ``base64``: the float32 values little-endian, base64-encoded, as OpenAI's clients decode them)
and ``user`` (accepted, unused: there is no per-user accounting here). Any other key is refused.
"""

from __future__ import annotations

import base64
import struct
from typing import Any, Sequence

import attrs

from kestrel_trio.errors import BadRequestError
from kestrel_trio.openai.fields.access import check_str, fail, get_int, get_str, join_path, load_object, require

__all__ = ["EmbeddingRequest", "parse_embedding_request", "embedding_response", "encode_vector", "MAX_INPUTS"]

MAX_INPUTS = 2048  # OpenAI's own bound on the inputs of one request
_KEYS = frozenset({"input", "model", "dimensions", "encoding_format", "user"})
_FORMATS = ("float", "base64")


@attrs.frozen
class EmbeddingRequest:
    """A validated embeddings request.

    Attributes:
        model: the requested model id.
        texts: the inputs as texts, or None when they are token ids.
        token_ids: the inputs as token-id lists, or None when they are texts.
        dimensions: the vector length wanted (None: the model's hidden size).
        encoding_format: "float" or "base64".
    """

    model: str
    texts: tuple[str, ...] | None
    token_ids: tuple[tuple[int, ...], ...] | None
    dimensions: int | None = None
    encoding_format: str = "float"

    @property
    def count(self) -> int:
        return len(self.texts if self.texts is not None else self.token_ids or ())


def parse_embedding_request(body: bytes) -> EmbeddingRequest:
    """Parse and validate a ``POST /v1/embeddings`` body.

    Raises:
        BadRequestError: malformed JSON, a missing ``input`` or ``model``, an unknown key, or an invalid
            field (``param`` names it).
    """
    obj = load_object(body)
    unknown = sorted(set(obj) - _KEYS)
    if unknown:
        raise BadRequestError(f"'{unknown[0]}' is not a field of an embeddings request (accepted: "
                              f"{', '.join(sorted(_KEYS))})", param=unknown[0])
    model = check_str(require(obj, "model"), "model")
    get_str(obj, "user")  # accepted for OpenAI compatibility; nothing is accounted per user
    dimensions = get_int(obj, "dimensions")
    if dimensions is not None and dimensions < 1:
        raise BadRequestError(f"'dimensions' must be at least 1, got {dimensions}", param="dimensions")
    encoding = get_str(obj, "encoding_format") or "float"
    if encoding not in _FORMATS:
        raise BadRequestError(f"'encoding_format' must be 'float' or 'base64', got {encoding!r}",
                              param="encoding_format")
    texts, ids = parse_input(require(obj, "input"), "input")
    return EmbeddingRequest(model, texts, ids, dimensions, encoding)


def parse_input(value: Any, param: str) -> tuple[tuple[str, ...] | None, tuple[tuple[int, ...], ...] | None]:
    """``input``'s texts, or its token-id lists (exactly one of the two is not None)."""
    if isinstance(value, str):
        return (_text(value, param),), None
    if not isinstance(value, list):
        raise fail(param, "a string, an array of strings, an array of token ids or an array of such arrays", value)
    if not value:
        raise BadRequestError(f"'{param}' must not be empty", param=param)
    if len(value) > MAX_INPUTS:
        raise BadRequestError(f"'{param}' may hold at most {MAX_INPUTS} inputs, got {len(value)}", param=param)
    if all(isinstance(item, str) for item in value):
        return tuple(_text(item, join_path(param, i)) for i, item in enumerate(value)), None
    if all(_is_int(item) for item in value):
        return None, (tuple(value),)
    if all(isinstance(item, list) for item in value):
        lists = []
        for i, item in enumerate(value):
            path = join_path(param, i)
            if not item or not all(_is_int(token) for token in item):
                raise fail(path, "a non-empty array of token ids", item)
            lists.append(tuple(item))
        return None, tuple(lists)
    raise BadRequestError(f"'{param}' must be all strings, all token ids or all arrays of token ids; it mixes "
                          "them", param=param)


def _text(value: str, path: str) -> str:
    if not value:
        raise BadRequestError(f"'{path}' must not be an empty string", param=path)
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def encode_vector(vector: Sequence[float], encoding_format: str) -> list[float] | str:
    """A vector as the response carries it: a list of floats, or its float32 little-endian bytes in base64."""
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return list(vector)


def embedding_response(model: str, vectors: Sequence[Sequence[float]], prompt_tokens: int,
                       encoding_format: str = "float") -> dict:
    """OpenAI's embeddings list: one ``embedding`` object per input, in order, and the usage."""
    data = [{"object": "embedding", "index": i, "embedding": encode_vector(vector, encoding_format)}
            for i, vector in enumerate(vectors)]
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}
