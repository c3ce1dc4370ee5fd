"""A request's room in the context window: :func:`check_context`, run before a generation starts."""

from __future__ import annotations

from kestrel_trio.errors import ContextLengthError

__all__ = ["check_context"]


def check_context(
    prompt_tokens: int, max_tokens: int | None, context_length: int, *, param: str,
    max_tokens_param: str = "max_tokens", context_name: str = "model's context length",
) -> int:
    """The effective max_tokens, or ContextLengthError naming the field at fault.

    Args:
        prompt_tokens: tokens in the prompt.
        max_tokens: requested new tokens, None for "as many as fit".
        context_length: the context window served (tokens).
        param: the request field that carried the prompt.
        max_tokens_param: the request field that carried ``max_tokens``.
        context_name: how the message names ``context_length`` (``Model.context_name``).
    """
    if prompt_tokens >= context_length:
        raise ContextLengthError(
            f"The prompt is {prompt_tokens} tokens, but the {context_name} is {context_length} tokens "
            f"(at least one token must remain for the answer)",
            param=param,
        )
    room = context_length - prompt_tokens
    if max_tokens is None:
        return room
    if max_tokens > room:
        raise ContextLengthError(
            f"The prompt ({prompt_tokens} tokens) plus {max_tokens_param} ({max_tokens}) exceeds the "
            f"{context_name} of {context_length} tokens",
            param=max_tokens_param,
        )
    return max_tokens
