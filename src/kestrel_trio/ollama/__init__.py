"""Ollama's API schema layer: request bodies -> the server's chat request, NDJSON and listings out.

Imports neither trio nor numpy. The routes are :mod:`kestrel_trio.app.ollama.routes`.
"""

from kestrel_trio.ollama.models import ModelFacts, listed_name, names_of, ps_body, show_body, tags_body, version_body
from kestrel_trio.ollama.options import NEUTRAL_ONLY, RUNTIME_OPTIONS, sampling_from_options
from kestrel_trio.ollama.requests import (
    EmbedInput, OllamaChat, OllamaGenerate, parse_chat, parse_embed, parse_generate, parse_show,
)
from kestrel_trio.ollama.responses import (
    NDJSON, OLLAMA_VERSION, Timings, chat_chunk, created_at, error_body, final_fields, generate_chunk, ndjson_line,
    tool_calls,
)

__all__ = [
    "ModelFacts", "listed_name", "names_of", "ps_body", "show_body", "tags_body", "version_body",
    "NEUTRAL_ONLY", "RUNTIME_OPTIONS", "sampling_from_options",
    "EmbedInput", "OllamaChat", "OllamaGenerate", "parse_chat", "parse_embed", "parse_generate", "parse_show",
    "NDJSON", "OLLAMA_VERSION", "Timings", "chat_chunk", "created_at", "error_body", "final_fields",
    "generate_chunk", "ndjson_line", "tool_calls",
]
