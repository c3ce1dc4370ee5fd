"""OpenAI's Responses API, stateless: request bodies into the server's chat request, answers into Response
objects and their events.

Imports neither trio nor numpy; built on the rest of :mod:`kestrel_trio.openai` (the chat request it
translates into, the structured-output values, the JSON helpers).
"""

from kestrel_trio.openai.responses_api.events import ResponseAssembler, new_response_id, sse_event
from kestrel_trio.openai.responses_api.fields import NO_OP_FIELDS, REFUSED_FIELDS
from kestrel_trio.openai.responses_api.request import (
    EFFORTS,
    ResponsesRequest,
    parse_input_tokens_request,
    parse_responses_request,
)

__all__ = ["ResponseAssembler", "new_response_id", "sse_event", "NO_OP_FIELDS", "REFUSED_FIELDS", "EFFORTS",
           "ResponsesRequest", "parse_responses_request", "parse_input_tokens_request"]
