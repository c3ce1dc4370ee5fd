"""Anthropic Messages bodies -> the server's chat request (sans-IO)."""

from __future__ import annotations

import json

import pytest

from kestrel_trio import anthropic as an
from kestrel_trio.errors import BadRequestError

TOOL = {"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}


def parse(**body) -> an.MessagesRequest:
    body.setdefault("model", "m")
    body.setdefault("max_tokens", 32)
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return an.parse_messages_request(json.dumps(body).encode())


def refused(match: str, **body) -> BadRequestError:
    with pytest.raises(BadRequestError, match=match) as caught:
        parse(**body)
    return caught.value


def test_system_blocks_and_turns_become_chat_messages() -> None:
    req = parse(system=[{"type": "text", "text": "Be terse.", "cache_control": {"type": "ephemeral"}},
                        {"type": "text", "text": "Be kind."}],
                messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                          {"role": "assistant", "content": "c"}, {"role": "user", "content": "d"}])
    assert req.chat.messages == ({"role": "system", "content": "Be terse.\nBe kind."},
                                 {"role": "user", "content": "a\nb"},
                                 {"role": "assistant", "content": "c"}, {"role": "user", "content": "d"})
    assert req.prefill == "" and req.thinking is None and req.chat.model == "m"


def test_a_system_turn_inside_messages_stays_a_system_message_where_it_stands() -> None:
    """Claude Code 2.1.154+ (Anthropic's mid-conversation system beta) puts system turns after user turns."""
    req = parse(system="Be terse.", messages=[
        {"role": "user", "content": "a"},
        {"role": "system", "content": [{"type": "text", "text": "Skills: none.",
                                        "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": "b"}, {"role": "system", "content": "Agents: none."}])
    assert req.chat.messages == ({"role": "system", "content": "Be terse."}, {"role": "user", "content": "a"},
                                 {"role": "system", "content": "Skills: none."}, {"role": "assistant", "content": "b"},
                                 {"role": "system", "content": "Agents: none."})
    assert req.prefill == ""
    refused("'messages\\[1\\].content\\[0\\].type' must be 'text'",
            messages=[{"role": "user", "content": "a"}, {"role": "system", "content": [{"type": "image"}]}])


def test_claude_codes_billing_line_is_dropped_from_the_system_prompt() -> None:
    """Its ``cch=`` differs on every request: kept, no two prompts would share their first tokens."""
    req = parse(system=[{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.37; cch=fa690;"},
                        {"type": "text", "text": "You are Claude Code."}])
    assert req.chat.messages[0] == {"role": "system", "content": "You are Claude Code."}
    req = parse(system=[{"type": "text", "text": "Mention x-anthropic-billing-header: here."}])
    assert req.chat.messages[0]["content"] == "Mention x-anthropic-billing-header: here."


def test_context_management_takes_clear_thinking_edits_only() -> None:
    for keep in ("all", {"type": "thinking_turns", "value": 2}):
        parse(context_management={"edits": [{"type": "clear_thinking_20251015", "keep": keep}]})
    parse(context_management={"edits": []})
    assert refused("clear_tool_uses_20250919.*not supported", context_management={
        "edits": [{"type": "clear_tool_uses_20250919"}]}).param == "context_management.edits[0].type"
    refused("'context_management.edits\\[0\\].keep' must be", context_management={
        "edits": [{"type": "clear_thinking_20251015", "keep": "some"}]})
    refused("context_management.edits\\[0\\].trigger: Extra inputs", context_management={
        "edits": [{"type": "clear_thinking_20251015", "trigger": {}}]})
    refused("context_management.pause: Extra inputs", context_management={"edits": [], "pause": 1})


def test_a_deferred_tool_is_offered_once_a_tool_reference_loads_it() -> None:
    """Claude Code's tool search: deferred tools stay out of the prompt until its search answers with them."""
    search = {"name": "ToolSearch", "input_schema": {"type": "object"}}
    deferred = {**TOOL, "defer_loading": True}
    ask = {"role": "user", "content": "Weather?"}
    req = parse(tools=[search, deferred], messages=[ask])
    assert [tool["function"]["name"] for tool in req.chat.tools] == ["ToolSearch"]
    found = [ask, {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "ToolSearch",
                                                      "input": {"query": "weather"}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
                 {"type": "tool_reference", "tool_name": "get_weather"}]}]}]
    req = parse(tools=[search, deferred], messages=found)
    assert [tool["function"]["name"] for tool in req.chat.tools] == ["ToolSearch", "get_weather"]
    assert req.chat.messages[-1] == {"role": "tool", "tool_call_id": "t1", "content": "Tool loaded: get_weather"}
    forced = parse(tools=[search, deferred], messages=[ask], tool_choice={"type": "tool", "name": "get_weather"})
    assert [tool["function"]["name"] for tool in forced.chat.tools] == ["ToolSearch", "get_weather"]
    alone = parse(tools=[deferred], messages=[ask], tool_choice={"type": "auto"})
    assert alone.chat.tools is None and alone.chat.tool_choice is None
    refused("'tools\\[0\\].defer_loading' must be", tools=[{**TOOL, "defer_loading": "yes"}])


def test_the_query_string_may_say_beta_only() -> None:
    for query in ("", "beta=true", "beta=false"):
        an.check_query(query)
    with pytest.raises(BadRequestError, match="'limit': Extra inputs") as caught:
        an.check_query("beta=true&limit=3")
    assert caught.value.param == "limit"
    with pytest.raises(BadRequestError, match="'beta' must be true or false"):
        an.check_query("beta=1")


def test_tool_use_and_tool_result_blocks_become_tool_calls_and_tool_messages() -> None:
    req = parse(tools=[TOOL], messages=[
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "sig"},
                                          {"type": "text", "text": "Checking."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"},
                                     {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
                                      "content": [{"type": "text", "text": "timeout"}]},
                                     {"type": "text", "text": "and tomorrow?"}]}])
    assert req.chat.messages[1:] == (
        {"role": "assistant", "content": "Checking.", "reasoning_content": "hmm",
         "tool_calls": [{"id": "toolu_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: timeout"},
        {"role": "user", "content": "and tomorrow?"})
    assert req.chat.tools == ({"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                                                "parameters": {"type": "object"}}},)


def test_images_become_image_url_parts() -> None:
    req = parse(messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.jpg"}},
        {"type": "text", "text": "What is this?"}]}])
    assert req.chat.messages == ({"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}},
        {"type": "text", "text": "What is this?"}]},)
    refused("media_type", messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/tiff", "data": "x"}}]}])


@pytest.mark.parametrize(("choice", "expected", "parallel"), [
    ({"type": "auto"}, "auto", True),
    ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
    ({"type": "tool", "name": "get_weather"}, {"type": "function", "function": {"name": "get_weather"}}, True),
    ({"type": "none"}, "none", True),
])
def test_tool_choice_maps_onto_the_chat_one(choice, expected, parallel) -> None:
    req = parse(tools=[TOOL], tool_choice=choice)
    assert (req.chat.tool_choice, req.chat.parallel_tool_calls) == (expected, parallel)


def test_tool_choice_refusals() -> None:
    refused("not one of the 'tools'", tools=[TOOL], tool_choice={"type": "tool", "name": "other"})
    refused("no 'tools'", tool_choice={"type": "any"})
    refused("server tools", tools=[{"type": "web_search_20250305", "name": "web_search"}])
    refused("must be unique", tools=[TOOL, TOOL])


def test_sampling_fields() -> None:
    sampling = parse(max_tokens=7, temperature=0.5, top_p=0.9, top_k=3, stop_sequences=["END"],
                     stream=True).chat.sampling
    assert (sampling.max_tokens, sampling.temperature, sampling.top_p, sampling.top_k, sampling.stop,
            sampling.stream) == (7, 0.5, 0.9, 3, ("END",), True)
    refused("max_tokens: Field required", max_tokens=None)
    refused("'max_tokens' must be at least 1", max_tokens=0)
    refused(r"'temperature' must be in \[0, 1\]", temperature=1.5)
    refused("'stop_sequences\\[0\\]' must not be empty", stop_sequences=[""])
    refused("at most", stop_sequences=["x"] * (an.MAX_STOP_SEQUENCES + 1))


def test_thinking() -> None:
    assert (parse(max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 1024}).thinking,
            parse(thinking={"type": "disabled"}).thinking, parse(thinking={"type": "adaptive"}).thinking) == \
        (True, False, None)
    refused("at least 1024", max_tokens=4096, thinking={"type": "enabled", "budget_tokens": 100})
    refused("greater than", max_tokens=1024, thinking={"type": "enabled", "budget_tokens": 1024})
    refused("budget_tokens: Field required", thinking={"type": "enabled"})
    refused("'thinking.type' must be", thinking={"type": "sometimes"})


def test_budget_tokens_is_the_chat_requests_reasoning_budget() -> None:
    chat = parse(max_tokens=4096, thinking={"type": "enabled", "budget_tokens": 2048}).chat
    assert (chat.thinking, chat.thinking_budget, chat.thinking_budget_param) == (True, 2048, "thinking.budget_tokens")
    assert parse(thinking={"type": "disabled"}).chat.thinking_budget is None
    assert parse(thinking={"type": "adaptive"}).chat.thinking_budget is None


def test_a_final_assistant_turn_is_a_prefill() -> None:
    req = parse(messages=[{"role": "user", "content": "Count"}, {"role": "assistant", "content": "1, 2,"}])
    assert req.prefill == "1, 2," and req.chat.messages == ({"role": "user", "content": "Count"},)
    refused("text only", tools=[TOOL], messages=[
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "get_weather", "input": {}}]}])


def test_roles_and_block_types_are_checked() -> None:
    refused("'messages' must hold a user turn", messages=[{"role": "system", "content": "x"}])
    refused("'messages\\[0\\].role' must be 'user', 'assistant' or 'system'; got 'tool'",
            messages=[{"role": "tool", "content": "x"}])
    refused("'messages\\[0\\].content\\[0\\].type' must be 'text', 'image' or 'tool_result'",
            messages=[{"role": "user", "content": [{"type": "document", "source": {}}]}])
    refused("must be 'text', 'tool_use' or 'thinking'", messages=[
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]},
        {"role": "user", "content": "y"}])
    refused("at least one message", messages=[])


def test_unknown_fields_are_refused_and_no_ops_accepted() -> None:
    assert refused("frobnicate: Extra inputs are not permitted", frobnicate=1).param == "frobnicate"
    refused("messages\\[0\\].content\\[0\\].colour: Extra inputs",
            messages=[{"role": "user", "content": [{"type": "text", "text": "x", "colour": "red"}]}])
    refused("MCP", mcp_servers=[{"type": "url"}])
    refused("'service_tier' must be one of", service_tier="priority")
    parse(metadata={"user_id": "u"}, service_tier="auto", cache_control={"type": "ephemeral"}, speed="standard",
          output_config={"effort": "high"}, tools=[{**TOOL, "cache_control": {"type": "ephemeral"}}], mcp_servers=None)
    refused("output_config.format", output_config={"format": {"type": "json_schema", "schema": {}}})


def test_count_tokens_takes_no_sampling_fields() -> None:
    req = an.parse_count_tokens_request(json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]})
                                        .encode())
    assert req.chat.sampling.max_tokens is None
    with pytest.raises(BadRequestError, match="max_tokens: Extra inputs"):
        an.parse_count_tokens_request(json.dumps({"model": "m", "max_tokens": 3, "messages": []}).encode())


def test_the_docs_list_every_no_op_and_refused_field() -> None:
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "anthropic.md").read_text()
    for field, (accepts, why, _check) in an.NO_OP_FIELDS.items():
        assert f"| `{field}` | {accepts} | {why} |" in page, field
    for field, why in an.REFUSED_FIELDS.items():
        assert f"| `{field}` | {why} |" in page, field
