"""A ChatChoice reading a Qwen3 model's output, built as the app layer builds one (for the choice-assembly tests)."""

from __future__ import annotations

from kestrel_trio.openai import ChatChoice
from kestrel_trio.text.chat_formats import QWEN3, new_call_id


def qwen3_choice(index: int = 0, *, reasoning: bool = False, starts_in_reasoning: bool = False,
                 parse_tools: bool = False, forced_prefix: str = "", logprobs: bool = False, make_id=new_call_id,
                 parallel_tool_calls: bool = True) -> ChatChoice:
    """Choice ``index`` whose output goes through Qwen3's parser (reasoning split, Hermes tool calls as asked)."""
    parser = QWEN3.output_parser(reasoning=reasoning, starts_in_reasoning=starts_in_reasoning,
                                 parse_tools=parse_tools, forced_prefix=forced_prefix, make_id=make_id)
    return ChatChoice(index, parser, logprobs, parallel_tool_calls=parallel_tool_calls)
