"""The OpenAI schema layer: JSON <-> values, validation, error bodies, SSE framing.

Imports neither trio nor numpy. Its rooms: ``fields`` (the JSON field checks every API front shares),
``request`` (request bodies -> validated values), ``response`` (response bodies, choices, logprobs, SSE) and
``responses_api`` (the Responses API over the chat request); ``embeddings`` is ``/v1/embeddings``'s request
and response. A room imports its own modules and lower rooms only (the ranks: tests/openai/test_openai_rooms.py).
This package re-exports the names the app layer and the other API fronts use.
"""

from kestrel_trio.errors import error_body, error_body_for, error_object
from kestrel_trio.openai.request.bodies import (
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    SamplingFields,
    TokenizeRequest,
    parse_chat_request,
    parse_completion_request,
    parse_detokenize_request,
    parse_tokenize_request,
)
from kestrel_trio.openai.request.sampling_fields import COMPLETIONS_DEFAULT_MAX_TOKENS, default_max_tokens
from kestrel_trio.openai.request.structured import StructuredOutput, parse_structured_output
from kestrel_trio.openai.response.bodies import (
    Usage,
    chat_chunk,
    chat_chunk_usage,
    chat_completion_of,
    completion_chunk_of,
    completion_of,
    completion_chunk_usage,
    model_card,
    models_list,
    new_id,
    to_json_bytes,
    usage_dict,
)
from kestrel_trio.openai.response.choices import ChatChoice, CompletionChoice
from kestrel_trio.openai.response.logprobs import LogprobToken, TokenLogprob
from kestrel_trio.openai.response.sse import SSE_DONE, SSEFormatError, parse_sse, sse_error, sse_event

__all__ = [
    "ChatChoice",
    "CompletionChoice",
    "LogprobToken",
    "TokenLogprob",
    "StructuredOutput",
    "parse_structured_output",
    "chat_chunk",
    "chat_completion_of",
    "completion_of",
    "completion_chunk_of",
    "error_object",
    "error_body",
    "error_body_for",
    "SamplingFields",
    "COMPLETIONS_DEFAULT_MAX_TOKENS",
    "default_max_tokens",
    "ChatRequest",
    "CompletionRequest",
    "TokenizeRequest",
    "DetokenizeRequest",
    "parse_chat_request",
    "parse_completion_request",
    "parse_tokenize_request",
    "parse_detokenize_request",
    "Usage",
    "usage_dict",
    "new_id",
    "to_json_bytes",
    "chat_chunk_usage",
    "completion_chunk_usage",
    "model_card",
    "models_list",
    "SSE_DONE",
    "SSEFormatError",
    "sse_event",
    "sse_error",
    "parse_sse",
]
