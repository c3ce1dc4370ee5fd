"""The Anthropic Messages schema layer: request bodies into the server's chat request, answers into messages,
events and error envelopes.

Imports neither trio nor numpy; builds on :mod:`kestrel_trio.openai` (the chat request it translates into,
the JSON helpers), so it ranks above it.
"""

from kestrel_trio.anthropic.fields import NO_OP_FIELDS, REFUSED_FIELDS
from kestrel_trio.anthropic.requests import (
    MAX_STOP_SEQUENCES,
    MIN_THINKING_BUDGET,
    MessagesRequest,
    check_query,
    parse_count_tokens_request,
    parse_messages_request,
)
from kestrel_trio.anthropic.responses import (
    MessageAssembler,
    error_body,
    error_object,
    error_type_for,
    new_message_id,
    new_tool_use_id,
    sse_event,
    stop_reason_of,
)

__all__ = [
    "NO_OP_FIELDS", "REFUSED_FIELDS", "MAX_STOP_SEQUENCES", "MIN_THINKING_BUDGET", "MessagesRequest", "check_query",
    "parse_count_tokens_request", "parse_messages_request", "MessageAssembler", "error_body", "error_object",
    "error_type_for", "new_message_id", "new_tool_use_id", "sse_event", "stop_reason_of",
]
