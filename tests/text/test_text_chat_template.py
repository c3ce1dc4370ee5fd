"""ChatTemplate: byte-exact renderings of the real Qwen3 template.

The expected strings of the tool and reasoning conversations below were
produced once, offline, by transformers 5.23 itself and pasted here:

    tok = AutoTokenizer.from_pretrained("path/to/Qwen3-tokenizer-folder")  # the upstream Qwen/Qwen3-0.6B files
    tok.apply_chat_template(conversation, tools=TOOLS, tokenize=False, add_generation_prompt=True)

(the reasoning conversations without tools and with add_generation_prompt=False),
run with the reference venv (torch + transformers) and HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

import copy
import json
from datetime import datetime
from pathlib import Path

import pytest

from kestrel_trio.errors import BadRequestError, ModelLoadError
from kestrel_trio.text import ChatTemplate, Tokenizer, missing_template_error

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

SIMPLE = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 2+2?"},
]
SIMPLE_PROMPT = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    "<|im_start|>assistant\n"
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city; units <°C> & <°F>.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. Zürich"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    }
]


def tool_conversation(arguments_1: object, arguments_2: object) -> list[dict]:
    """An OpenAI-shaped tool round trip: two calls (content None), two results."""
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Weather in Zürich and 東京?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments_1}},
                {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": arguments_2}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21, "unit": "celsius"}'},
        {"role": "tool", "tool_call_id": "call_2", "content": '{"temperature": 18, "unit": "celsius"}'},
    ]


# Produced by transformers (see the module docstring); not edited by hand.
TOOLS_SYSTEM_PREFIX = (
    "<|im_start|>system\n"
    "You are a helpful assistant.\n"
    "\n"
    "# Tools\n"
    "\n"
    "You may call one or more functions to assist with the user query.\n"
    "\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city; units <°C> & <°F>.", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name, e.g. Zürich"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}\n'
    "</tools>\n"
    "\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n"
    "Weather in Zürich and 東京?<|im_end|>\n"
    "<|im_start|>assistant\n"
)
TOOL_RESULTS_SUFFIX = (
    "<|im_start|>user\n"
    "<tool_response>\n"
    '{"temperature": 21, "unit": "celsius"}\n'
    "</tool_response>\n"
    "<tool_response>\n"
    '{"temperature": 18, "unit": "celsius"}\n'
    "</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n"
)
# Arguments given as dicts: the template serialises them with tojson.
TOOL_CALLS_FROM_DICTS = (
    "<tool_call>\n"
    '{"name": "get_weather", "arguments": {"unit": "celsius", "city": "Zürich"}}\n'
    "</tool_call>\n"
    "<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "東京"}}\n'
    "</tool_call><|im_end|>\n"
)
# Arguments given as JSON strings (what OpenAI clients send): inserted verbatim.
TOOL_CALLS_FROM_STRINGS = (
    "<tool_call>\n"
    '{"name": "get_weather", "arguments": {"unit":"celsius","city":"Zürich"}}\n'
    "</tool_call>\n"
    "<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "\\u6771\\u4eac"}}\n'
    "</tool_call><|im_end|>\n"
)

REASONING_HISTORY = [
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4", "reasoning": "Two plus two."},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "<think>\nThree plus three.\n</think>\n\n6"},
]
# Produced by transformers, add_generation_prompt=False, no tools.
REASONING_HISTORY_PROMPT = (
    "<|im_start|>user\n2+2?<|im_end|>\n"
    "<|im_start|>assistant\n4<|im_end|>\n"
    "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nThree plus three.\n</think>\n\n6<|im_end|>\n"
)
# The first two messages alone: the "reasoning" field is aliased to reasoning_content.
REASONING_LAST_PROMPT = (
    "<|im_start|>user\n2+2?<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nTwo plus two.\n</think>\n\n4<|im_end|>\n"
)


@pytest.fixture(scope="module")
def qwen_template(qwen_tokenizer: Tokenizer) -> ChatTemplate:
    assert qwen_tokenizer.chat_template is not None
    return ChatTemplate(qwen_tokenizer.chat_template, special_tokens=qwen_tokenizer.special_tokens_map)


def test_thinking_disabled_adds_an_empty_think_block(qwen_template: ChatTemplate, qwen_tokenizer: Tokenizer) -> None:
    prompt = qwen_template.render(SIMPLE, enable_thinking=False)
    assert prompt == SIMPLE_PROMPT + "<think>\n\n</think>\n\n"
    assert len(qwen_tokenizer.encode(prompt)) == 30


@pytest.mark.parametrize("kwargs", [{"enable_thinking": True}, {}], ids=["enabled", "unset"])
def test_thinking_enabled_or_unset_ends_at_assistant(
    qwen_template: ChatTemplate, qwen_tokenizer: Tokenizer, kwargs: dict
) -> None:
    prompt = qwen_template.render(SIMPLE, **kwargs)
    assert prompt == SIMPLE_PROMPT
    assert len(qwen_tokenizer.encode(prompt)) == 26


def test_without_generation_prompt(qwen_template: ChatTemplate) -> None:
    assert qwen_template.render(SIMPLE, add_generation_prompt=False) == SIMPLE_PROMPT.removesuffix("<|im_start|>assistant\n")


def test_tool_calls_with_dict_arguments_match_transformers(qwen_template: ChatTemplate) -> None:
    messages = tool_conversation({"unit": "celsius", "city": "Zürich"}, {"city": "東京"})
    pristine = copy.deepcopy(messages)
    prompt = qwen_template.render(messages, tools=TOOLS)
    assert prompt == TOOLS_SYSTEM_PREFIX + TOOL_CALLS_FROM_DICTS + TOOL_RESULTS_SUFFIX
    assert messages == pristine  # the caller's messages are untouched


def test_tool_calls_with_json_string_arguments_match_transformers(qwen_template: ChatTemplate) -> None:
    messages = tool_conversation('{"unit":"celsius","city":"Zürich"}', '{"city": "\\u6771\\u4eac"}')
    prompt = qwen_template.render(messages, tools=TOOLS)
    assert prompt == TOOLS_SYSTEM_PREFIX + TOOL_CALLS_FROM_STRINGS + TOOL_RESULTS_SUFFIX


def test_reasoning_fields_match_transformers(qwen_template: ChatTemplate) -> None:
    assert qwen_template.render(REASONING_HISTORY, add_generation_prompt=False) == REASONING_HISTORY_PROMPT
    assert qwen_template.render(REASONING_HISTORY[:2], add_generation_prompt=False) == REASONING_LAST_PROMPT


def test_tojson_keeps_key_order_and_does_not_escape() -> None:
    template = ChatTemplate("{{ tools[0] | tojson }}|{{ tools[0] | tojson(indent=2) }}")
    rendered = template.render([{"role": "user", "content": "x"}], tools=[{"z": "<&>", "a": "é"}])
    assert rendered == '{"z": "<&>", "a": "é"}|{\n  "z": "<&>",\n  "a": "é"\n}'


def test_special_tokens_and_kwargs_are_template_variables() -> None:
    template = ChatTemplate("{{ eos_token }}{{ pad_token }}", special_tokens={"eos_token": "<E>", "pad_token": "<P>"})
    assert template.render([{"role": "user", "content": "x"}]) == "<E><P>"
    assert template.render([{"role": "user", "content": "x"}], pad_token="<Q>") == "<E><Q>"


def test_template_globals() -> None:
    template = ChatTemplate(
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %}"
        "|{{ strftime_now('%Y') }}"
    )
    rendered = template.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    assert rendered == f"a|{datetime.now().year}"


def test_raise_exception_becomes_a_bad_request() -> None:
    template = ChatTemplate(
        "{% if messages[0].role != 'user' %}"
        "{{ raise_exception('Conversations must start with a user turn.') }}"
        "{% endif %}ok"
    )
    assert template.render([{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(BadRequestError, match="must start with a user turn") as info:
        template.render([{"role": "assistant", "content": "x"}])
    assert info.value.param == "messages"


def test_runtime_template_errors_become_bad_requests(qwen_template: ChatTemplate) -> None:
    # Qwen3's template concatenates a system message's content to a string.
    with pytest.raises(BadRequestError) as info:
        qwen_template.render(
            [{"role": "system", "content": [{"type": "text", "text": "x"}]}, {"role": "user", "content": "y"}], tools=TOOLS
        )
    assert info.value.param == "messages"



@pytest.mark.parametrize(
    "source", ["{{ messages.append(1) }}", "{{ no_such_variable.method() }}"], ids=["immutable-sandbox", "undefined"]
)
def test_sandbox_and_undefined_errors_become_bad_requests(source: str) -> None:
    messages = [{"role": "user", "content": "x"}]
    with pytest.raises(BadRequestError) as info:
        ChatTemplate(source).render(messages)
    assert info.value.param == "messages"
    assert messages == [{"role": "user", "content": "x"}]


@pytest.mark.parametrize(
    ("messages", "tools", "param"),
    [([], None, "messages"), (["hello"], None, "messages"), ("hello", None, "messages"), (SIMPLE, ["not a schema"], "tools")],
)
def test_malformed_inputs(qwen_template: ChatTemplate, messages: object, tools: object, param: str) -> None:
    with pytest.raises(BadRequestError) as info:
        qwen_template.render(messages, tools=tools)  # type: ignore[arg-type]
    assert info.value.param == param


def test_syntax_error_is_a_load_error() -> None:
    with pytest.raises(ModelLoadError, match="syntax"):
        ChatTemplate("{% for m in messages %}{{ m.content }}")


def test_missing_template_error() -> None:
    error = missing_template_error()
    assert isinstance(error, BadRequestError)
    assert error.status == 400 and "chat template" in error.message


def test_check_kwargs_refuses_a_variable_the_template_never_reads() -> None:
    template = ChatTemplate("{% macro m() %}{{ documents }}{% endmacro %}{% if enable_thinking is defined %}x{% endif %}"
                            "{{ m() }}{{ eos_token }}", special_tokens={"eos_token": "<E>"})
    template.check_kwargs(["enable_thinking", "documents", "eos_token"], "chat_template_kwargs")  # all read
    with pytest.raises(BadRequestError) as info:
        template.check_kwargs(["enable_thinking", "enable_thinkin"], "chat_template_kwargs")
    assert info.value.param == "chat_template_kwargs.enable_thinkin"
    assert "reads: documents, enable_thinking" in info.value.message


# Tools on a template that cannot render them (the fallback of kestrel_trio.text.chat_formats.hermes).

# SmolLM2-135M-Instruct's chat template, as its GGUF file carries it: ChatML that knows nothing of tools.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
QUESTION = [{"role": "user", "content": "Weather in Zürich and 東京?"}]


@pytest.fixture(scope="module")
def chatml_template() -> ChatTemplate:
    return ChatTemplate(SMOLLM2_TEMPLATE, special_tokens={"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"})


def test_a_template_without_tools_renders_a_tool_round_trip_as_qwen3s_does(chatml_template: ChatTemplate) -> None:
    """Byte for byte what transformers renders with Qwen3's own template: tools, calls and results."""
    assert "tools" not in chatml_template.variables and not chatml_template.renders_tool_turns
    messages = tool_conversation({"unit": "celsius", "city": "Zürich"}, {"city": "東京"})
    pristine = copy.deepcopy(messages)
    expected = TOOLS_SYSTEM_PREFIX + TOOL_CALLS_FROM_DICTS + TOOL_RESULTS_SUFFIX
    assert chatml_template.render(messages, tools=TOOLS) == expected
    assert messages == pristine
    messages = tool_conversation('{"unit":"celsius","city":"Zürich"}', '{"city": "\\u6771\\u4eac"}')
    expected = TOOLS_SYSTEM_PREFIX + TOOL_CALLS_FROM_STRINGS + TOOL_RESULTS_SUFFIX
    assert chatml_template.render(messages, tools=TOOLS) == expected


def test_without_a_system_message_the_tools_become_the_system_message(chatml_template: ChatTemplate) -> None:
    plain = chatml_template.render(QUESTION)
    prompt = chatml_template.render(QUESTION, tools=TOOLS)
    assert "SmolLM" in plain and "get_weather" not in plain
    assert prompt.startswith("<|im_start|>system\n# Tools\n\n") and "SmolLM" not in prompt
    assert prompt == TOOLS_SYSTEM_PREFIX.replace("You are a helpful assistant.\n\n", "")


def test_tool_turns_are_text_even_when_no_tools_are_offered(chatml_template: ChatTemplate) -> None:
    """tool_choice "none" renders no tools, but the history's calls and results still read as such."""
    prompt = chatml_template.render(tool_conversation({"city": "Zürich"}, {"city": "東京"}))
    assert "# Tools" not in prompt
    assert prompt.endswith('</tool_call><|im_end|>\n' + TOOL_RESULTS_SUFFIX)
    assert "<|im_start|>tool" not in prompt


def test_the_qwen3_fixture_template_renders_tools_itself() -> None:
    """The fixture checkpoint's own template (Qwen3's): its tools and tool turns are its own, as transformers'."""
    config = json.loads((FIXTURES / "qwen3_bf16_tied" / "tokenizer_config.json").read_text(encoding="utf-8"))
    template = ChatTemplate(config["chat_template"], special_tokens={"eos_token": config["eos_token"]})
    assert template.renders_tool_turns
    messages = tool_conversation({"unit": "celsius", "city": "Zürich"}, {"city": "東京"})
    assert template.render(messages, tools=TOOLS) == TOOLS_SYSTEM_PREFIX + TOOL_CALLS_FROM_DICTS + TOOL_RESULTS_SUFFIX
    assert template.render(SIMPLE, tools=TOOLS).count("# Tools") == 1


# Writes the tools' names, but only beside a system message.
TOOLS_WITH_SYSTEM_ONLY = (
    "{% if tools and messages[0].role == 'system' %}TOOLS:{% for t in tools %} {{ t.function.name }}{% endfor %}\n"
    "{% endif %}{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
)


def test_a_template_rendering_tools_only_in_some_positions_gets_the_fallback_elsewhere() -> None:
    template = ChatTemplate(TOOLS_WITH_SYSTEM_ONLY)
    assert template.render(SIMPLE, tools=TOOLS).startswith("TOOLS: get_weather<system>You are a helpful assistant.\n")
    prompt = template.render(SIMPLE[1:], tools=TOOLS)
    assert "TOOLS:" not in prompt and prompt.startswith("<system># Tools\n\n") and "get_weather" in prompt


def test_a_template_that_reads_tools_but_writes_none_of_them_gets_the_fallback() -> None:
    template = ChatTemplate("{% if tools %}{% endif %}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")
    assert "tools" in template.variables
    assert template.render(SIMPLE, tools=TOOLS).startswith("<system>You are a helpful assistant.\n\n# Tools\n\n")


@pytest.mark.parametrize(("source", "reason"), [
    ("{% for m in messages %}{% if m.role != 'system' %}{{ m.content }}{% endif %}{% endfor %}", "drops the system"),
    ("{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}"
     "{% endif %}{{ m.content }}{% endfor %}", "System role not supported"),
], ids=["drops-system-messages", "refuses-system-messages"])
def test_tools_no_way_renders_are_refused_naming_tools(source: str, reason: str) -> None:
    template = ChatTemplate(source)
    assert template.render(SIMPLE[1:]) == "What is 2+2?"
    with pytest.raises(BadRequestError) as info:
        template.render(SIMPLE[1:], tools=TOOLS)
    assert info.value.param == "tools" and reason in info.value.message
    assert "does not render 'tools'" in info.value.message


def test_the_messages_own_error_comes_before_the_tools_one() -> None:
    template = ChatTemplate("{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system') }}"
                            "{% endif %}{{ m.content.upper() }}{% endfor %}")
    with pytest.raises(BadRequestError) as info:
        template.render([{"role": "user", "content": 3}], tools=TOOLS)
    assert info.value.param == "messages"
