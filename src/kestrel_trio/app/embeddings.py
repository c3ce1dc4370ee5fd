"""Embeddings over the engine: ``POST /v1/embeddings`` (OpenAI's shape); Ollama's ``/api/embed`` uses :func:`embed`.

Theory of operation: the texts are tokenized in a worker thread (the tokenizer's own special tokens added,
as sentence-transformers encodes them), token-id inputs are checked against the vocabulary, and the whole
batch is queued as ONE engine job (:meth:`Engine.open_embeddings`: 503 / 400 / 429 before any work). The
vectors are the model's final hidden states pooled as its folder says (last token unless a
sentence-transformers pooling config says mean or cls), L2-normalized; ``dimensions`` cuts and renormalizes.
"""

from __future__ import annotations

import attrs

from kestrel_trio import openai as oa
from kestrel_trio.engine import EmbeddingRequest
from kestrel_trio.errors import BadRequestError
from kestrel_trio.http import Request, Response
from kestrel_trio.openai.embeddings import embedding_response, parse_embedding_request

__all__ = ["EmbeddingRoutes", "embed", "EmbedResult"]


@attrs.frozen
class EmbedResult:
    """The vectors of one request (lists of floats, in input order) and the tokens they took."""

    vectors: list[list[float]]
    prompt_tokens: int


async def embed(routes, model_id: str | None, texts, token_ids, dimensions: int | None, *,
                param: str = "input") -> EmbedResult:
    """Embed ``texts`` (or ``token_ids`` lists) with the served model as one engine job.

    Args:
        routes: the app's ``_Routes`` (readiness, the worker threads).
        model_id: the requested model id (checked against the served one), or None.
        texts: the texts, or None.
        token_ids: the token-id lists, or None.
        dimensions: the vector length wanted (None: the hidden size).
        param: the request field the inputs came in, for error messages.

    Raises:
        BadRequestError: ``dimensions`` exceeds the hidden size, a token id is outside the vocabulary, or a
            text encodes to no tokens.
        ContextLengthError, QueueFullError, EngineUnavailableError: as the engine admits the job.
    """
    model, engine = routes._ready(model_id)
    hidden = model.config.hidden_size
    if dimensions is not None and dimensions > hidden:
        raise BadRequestError(f"'dimensions' must be at most {hidden} (this model's hidden size), got {dimensions}",
                              param="dimensions")
    if texts is not None:
        inputs = await routes._off_loop(_encode_all, model, texts, param)
    else:
        for i, ids in enumerate(token_ids):
            model.check_token_ids(list(ids), param=f"{param}[{i}]" if len(token_ids) > 1 else param)
        inputs = [list(ids) for ids in token_ids]
    handle = engine.open_embeddings(EmbeddingRequest(tuple(tuple(ids) for ids in inputs), param))
    async with handle:
        result = await handle.result()
    return EmbedResult(result.as_lists(dimensions), result.prompt_tokens)


def _encode_all(model, texts, param: str) -> list[list[int]]:
    """Each text's token ids (a worker thread's work)."""
    return [model.encode_for_embedding(text, param=f"{param}[{i}]" if len(texts) > 1 else param)
            for i, text in enumerate(texts)]


class EmbeddingRoutes:
    """``POST /v1/embeddings`` over the chat routes' readiness and workers (``routes``: the app's ``_Routes``)."""

    def __init__(self, routes) -> None:
        self.routes = routes

    async def embeddings(self, request: Request) -> Response:
        req = await self.routes._parse(parse_embedding_request, request.body)
        result = await embed(self.routes, req.model, req.texts, req.token_ids, req.dimensions)
        body = embedding_response(self.routes.state.model_id, result.vectors, result.prompt_tokens,
                                  req.encoding_format)
        return Response(status=200, body=oa.to_json_bytes(body))
