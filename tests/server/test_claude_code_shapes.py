"""Claude Code's request shapes, replayed against a real server through the official anthropic client.

Claude Code cannot be installed here (no network beyond package registries, and it needs an account), so its
requests are written down from what public reports show it sending to an ``ANTHROPIC_BASE_URL``; no body was
copied, each part is rebuilt from what these say:

* ``POST /v1/messages?beta=true`` with ``Authorization: Bearer``, ``anthropic-beta`` (a comma list starting
  ``claude-code-20250219``), ``x-stainless-*`` and ``user-agent: claude-cli/...``: a logged request in
  NikkeTryHard/zerogravity#2; the full beta list of Claude Code 2.1.185: ex-machina-co/opencode-anthropic-auth#174.
* ``system`` as text blocks whose first is ``x-anthropic-billing-header: cc_version=...; cch=...;`` (new on
  every request), then "You are Claude Code, ...": ggml-org/llama.cpp#20623, ujisati/claude-code-provider-proxy#23.
* ``cache_control: {"type": "ephemeral"}`` on system and message blocks, ``metadata.user_id``
  (``user_<hash>_account__session_<uuid>``), ``max_tokens`` in the tens of thousands, ``stream: true``:
  anomalyco/opencode#11083 (a body built to match Claude Code's), BerriAI/litellm#37623.
* ``role: "system"`` turns inside ``messages`` after the user turn (the mid-conversation system beta, Claude Code
  2.1.154 on): anthropics/claude-code#77698, ollama/ollama#16372, MadSkittles/Router-Maestro#95.
* ``context_management: {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}`` beside thinking:
  router-for-me/CLIProxyAPI#4784 (the value a proxy copies from Claude Code), mnfst/llm-gateway#2258.
* Tools with JSON Schemas carrying ``$schema`` and ``additionalProperties: false``, ``defer_loading: true`` on
  Read (tool search): BerriAI/litellm#22878 (Claude Code 2.1.69's tools as a proxy logged them),
  anthropics/claude-code#89211; an effort in ``output_config``: mnfst/llm-gateway#2258.

The same shapes were then seen from Claude Code 2.1.197 itself (the npm package, run in print mode through a
logging proxy against the demo model, see docs/anthropic.md): its headers, beta list, ``thinking``
``{"type": "adaptive"}``, ``output_config.effort``, ``context_management``, a ``metadata.user_id`` that is a JSON
string, the billing line and mid-conversation system turns are those below; its prompt text is not copied.

The answers are scripted as in test_anthropic_client.py: the real forward pass runs, the scripted token wins.
"""

from __future__ import annotations

import anthropic
import pytest
import trio

from kestrel_trio.model import Model

from server_kit import HOST, ScriptedModel, fetch, in_worker, running_server
from slow_host import allowance

TOKEN = "sk-local-claude-code"  # what ANTHROPIC_AUTH_TOKEN sends, as a Bearer token
BETAS = ["claude-code-20250219", "interleaved-thinking-2025-05-14", "thinking-token-count-2026-05-13",
         "context-management-2025-06-27", "prompt-caching-scope-2026-01-05", "mid-conversation-system-2026-04-07",
         "effort-2025-11-24"]
SESSION = "0b6f3c1e-7d1a-4c55-9a53-2f1d8e0c9b41"
HEADERS = {"x-app": "cli", "user-agent": "claude-cli/2.1.197 (external, sdk-cli)",
           "anthropic-dangerous-direct-browser-access": "true", "x-claude-code-session-id": SESSION}
# Older releases sent "user_<hash>_account__session_<uuid>"; 2.1.197 sends a JSON object in the string.
USER_ID = '{"device_id": "' + "3f" * 32 + '", "account_uuid": "", "session_id": "' + SESSION + '"}'
IDENTITY = "You are Claude Code, Anthropic's official CLI for Claude."
# Claude Code asks for 32000 tokens (CLAUDE_CODE_MAX_OUTPUT_TOKENS sets it), more than the demo model's 8192
# context leaves after any prompt: that is refused, as Anthropic refuses it; the replays ask for what fits.
MAX_TOKENS = 6000
GUIDE = "You are an interactive CLI tool that helps users with software engineering tasks. Be concise."
SKILLS = "<system-reminder>The following skills are available: none.</system-reminder>"
ASK = "List the files here."
THOUGHT = "I should run ls."
LISTING = "README.md\nsrc"
ANSWER = "There are two entries: README.md and src."
SCHEMA = "http://json-schema.org/draft-07/schema#"
TOOLS = [
    {"name": "Bash", "description": "Executes a given bash command and returns its output.",
     "input_schema": {"type": "object", "properties": {
         "command": {"type": "string", "description": "The command to execute"},
         "timeout": {"type": "number", "description": "Optional timeout in milliseconds (max 600000)"},
         "description": {"type": "string", "description": "Clear, concise description of what this command does"}},
         "required": ["command"], "additionalProperties": False, "$schema": SCHEMA}},
    {"name": "Read", "description": "Reads a file from the local filesystem.",
     "input_schema": {"type": "object", "properties": {
         "file_path": {"type": "string", "description": "The absolute path to the file to read"},
         "offset": {"type": "number"}, "limit": {"type": "number"}},
         "required": ["file_path"], "additionalProperties": False, "$schema": SCHEMA},
     "defer_loading": True, "cache_control": {"type": "ephemeral"}},
]
CALL = '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls", "description": "List files"}}\n</tool_call>'


def system(cch: str) -> list[dict]:
    """Claude Code's system blocks: the billing line (its ``cch`` new on every request), identity, guide."""
    return [{"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.185.3a1; cc_entrypoint=cli; "
                                     f"cch={cch};"},
            {"type": "text", "text": IDENTITY, "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": GUIDE, "cache_control": {"type": "ephemeral"}}]


FIRST_TURN = [{"role": "user", "content": [
                  {"type": "text", "text": "<system-reminder>Today's date is 2026-12-06.</system-reminder>"},
                  {"type": "text", "text": ASK, "cache_control": {"type": "ephemeral"}}]},
              {"role": "system", "content": SKILLS}]


def main_turn(model_id: str, messages: list[dict], cch: str) -> dict:
    """The body of one turn of Claude Code's main loop (thinking on), as ``client.beta.messages`` keywords."""
    return dict(model=model_id, max_tokens=MAX_TOKENS, messages=messages, system=system(cch), tools=TOOLS,
                metadata={"user_id": USER_ID}, extra_body={"temperature": 1},  # this SDK's beta has no keyword
                thinking={"type": "enabled", "budget_tokens": MAX_TOKENS - 1},
                context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
                output_config={"effort": "high"}, betas=BETAS, extra_headers=HEADERS)


def script(prompt: str) -> str:
    """What the model answers: a call to Bash, then, once it has the listing, the answer."""
    if "Summarize: ls" in prompt:  # the small side request
        return "<think>\n</think>\n\nListing files"
    if "<tool_response>" in prompt:
        return f"<think>\nThe listing came back.\n</think>\n\n{ANSWER}"
    if prompt.endswith("<|im_start|>assistant\n"):
        return f"<think>\n{THOUGHT}\n</think>\n\nLet me look.\n{CALL}"
    return "ok"


@pytest.fixture
def prompts() -> list[str]:
    return []


@pytest.fixture
def scripted(demo_model: Model, monkeypatch: pytest.MonkeyPatch, prompts: list[str]) -> Model:
    def recording(prompt: str) -> str:
        prompts.append(prompt)
        return script(prompt)

    return ScriptedModel(demo_model, recording).install(monkeypatch).model


async def with_client(server, work):
    """``work(client, model_id)`` in a worker thread, the client set up as Claude Code sets up its own."""
    return await in_worker(lambda: anthropic.Anthropic(base_url=f"http://{HOST}:{server.port}", auth_token=TOKEN,
                                                       api_key=None, max_retries=0, timeout=allowance(30)),
                           work, server.state.model_id)


async def test_a_streamed_turn_with_a_tool_call_and_its_result_round_trips(scripted, prompts) -> None:
    with trio.fail_after(allowance(180)):
        async with running_server(scripted, api_key=TOKEN) as server:
            def work(client, model_id):
                with client.beta.messages.stream(**main_turn(model_id, FIRST_TURN, "fa690")) as stream:
                    deltas = [event.delta.type for event in stream if event.type == "content_block_delta"]
                    first = stream.get_final_message()
                counted = client.beta.messages.count_tokens(
                    model=model_id, messages=FIRST_TURN, system=system("0c1d2"), tools=TOOLS,
                    thinking={"type": "enabled", "budget_tokens": MAX_TOKENS - 1},
                    context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
                    betas=[*BETAS, "token-counting-2024-11-01"], extra_headers=HEADERS)
                use = first.content[-1]
                # Claude Code sends the assistant turn back as it came, thinking (and its signature) included.
                turns = [*FIRST_TURN, {"role": "assistant", "content": [block.to_dict() for block in first.content]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                       "content": LISTING, "is_error": False,
                                                       "cache_control": {"type": "ephemeral"}}]}]
                with client.beta.messages.stream(**main_turn(model_id, turns, "7be21")) as stream:
                    second = stream.get_final_message()
                return deltas, first, counted, second

            deltas, first, counted, second = await with_client(server, work)
    assert [block.type for block in first.content] == ["thinking", "text", "tool_use"]
    assert first.content[0].thinking.strip() == THOUGHT and first.content[1].text.strip() == "Let me look."
    use = first.content[2]
    assert (use.name, use.input, first.stop_reason) == ("Bash", {"command": "ls", "description": "List files"},
                                                       "tool_use")
    assert {"thinking_delta", "text_delta", "input_json_delta"} <= set(deltas)
    assert counted.input_tokens == first.usage.input_tokens > 0
    assert [block.type for block in second.content] == ["thinking", "text"]
    assert second.content[1].text == ANSWER and second.stop_reason == "end_turn"
    # What the model read: no billing line; the system turn where Claude Code put it; the result after the call.
    first_prompt, second_prompt = prompts
    assert "x-anthropic-billing-header" not in first_prompt + second_prompt
    assert "Executes a given bash command" in first_prompt and "Reads a file" not in first_prompt  # Read deferred
    assert first_prompt.index(IDENTITY) < first_prompt.index(ASK) < first_prompt.index(SKILLS)
    assert second_prompt.index(SKILLS) < second_prompt.index('"command": "ls"') < second_prompt.index(LISTING)


async def test_the_billing_line_leaves_two_requests_the_same_prompt(scripted, prompts) -> None:
    """Its ``cch`` differs each time; the prompts must not, or the prefix cache could never reuse a turn."""
    with trio.fail_after(allowance(120)):
        async with running_server(scripted, api_key=TOKEN) as server:
            def work(client, model_id):
                return [client.beta.messages.create(model=model_id, max_tokens=512, system=system(cch),
                                                    messages=[{"role": "user", "content": "Summarize: ls"}],
                                                    metadata={"user_id": USER_ID}, extra_body={"temperature": 0},
                                                    betas=BETAS, extra_headers=HEADERS)
                        for cch in ("a1b2c", "d3e4f")]

            answers = await with_client(server, work)
    assert [answer.stop_reason for answer in answers] == ["end_turn", "end_turn"]
    assert len(prompts) == 2 and prompts[0] == prompts[1] and IDENTITY in prompts[0]


async def test_claude_codes_raw_headers_and_query_are_accepted_and_other_queries_refused(scripted) -> None:
    headers = (("authorization", f"Bearer {TOKEN}"), ("anthropic-version", "2023-06-01"),
               ("anthropic-beta", ",".join(BETAS)), ("x-stainless-lang", "js"), ("x-stainless-retry-count", "0"),
               ("x-stainless-timeout", "600"), *HEADERS.items())
    with trio.fail_after(allowance(120)):
        async with running_server(scripted, api_key=TOKEN) as server:
            body = {"model": server.state.model_id, "max_tokens": MAX_TOKENS, "stream": True, "system": system("9e8d7"),
                    "messages": FIRST_TURN, "metadata": {"user_id": USER_ID}, "thinking": {"type": "adaptive"},
                    "output_config": {"effort": "high"},
                    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}}
            streamed = await fetch(server.port, "POST", "/v1/messages?beta=true", body, headers=headers)
            odd = await fetch(server.port, "POST", "/v1/messages?beta=true&stream=false", body, headers=headers)
            too_long = await fetch(server.port, "POST", "/v1/messages?beta=true", {**body, "max_tokens": 32000},
                                   headers=headers)
            counted = await fetch(server.port, "POST", "/v1/messages/count_tokens?beta=true",
                                  {"model": server.state.model_id, "messages": FIRST_TURN, "system": system("1f2e3"),
                                   "thinking": {"type": "adaptive"}}, headers=headers)
    assert streamed.status == 200 and streamed.headers["content-type"].startswith("text/event-stream")
    assert b"event: message_stop" in streamed.body
    assert odd.status == 400 and odd.json()["type"] == "error"
    assert odd.json()["error"] == {"type": "invalid_request_error",
                                   "message": "query parameter 'stream': Extra inputs are not permitted"}
    assert counted.status == 200 and counted.json()["input_tokens"] > 0
    assert too_long.status == 400 and too_long.json()["error"]["type"] == "invalid_request_error"
    message = too_long.json()["error"]["message"]
    assert f"The prompt ({counted.json()['input_tokens']} tokens) plus max_tokens (32000)" in message
