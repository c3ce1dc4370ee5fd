"""A tool-calling agent loop against a kestrel-trio server, with the official openai client.

The loop: ask a question with a ``get_weather`` tool; while the model answers
with tool calls, run each call locally and send the result back as a
``role: "tool"`` message; print the final text.

Run a server with a real Qwen3 checkpoint, then the agent::

    kestrel-trio serve --model /path/to/Qwen3-0.6B --port 8000
    python examples/agent_loop.py --port 8000

``--port`` defaults to ``$KESTREL_PORT``, else 8000 (as ``kestrel-trio serve`` does);
``--base-url`` names any other server.

A model whose chat template cannot render tools (``--model smollm2-135m``) gets them
as a Hermes-style system prompt (docs/api.md, "Tools on every model"); a model that
small seldom calls them by itself. The built-in demo model has random weights and
will not call tools on its own; tests/server/test_tools.py runs this example
against a server whose model step is scripted to emit a real Qwen3 tool call.
"""

from __future__ import annotations

import argparse
import json
import os

import openai

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "City name, e.g. Paris"}},
                "required": ["city"],
            },
        },
    }
]


def get_weather(city: str) -> dict:
    """The local tool: a fixed forecast (a real agent would call a weather API)."""
    return {"city": city, "temperature_c": 18, "sky": "clear"}


def run_tool(name: str, arguments: str) -> str:
    """Run one tool call; errors go back to the model as text rather than crashing the loop."""
    try:
        if name != "get_weather":
            raise ValueError(f"unknown tool {name!r}")
        return json.dumps(get_weather(**json.loads(arguments)))
    except (ValueError, TypeError) as exc:
        return json.dumps({"error": str(exc)})


def run_agent(client: openai.OpenAI, model: str, question: str, max_turns: int = 4,
              max_tokens: int = 256) -> tuple[str, list[dict]]:
    """Ask ``question``, answering tool calls until the model gives a final text.

    Returns:
        (final text, the whole conversation as sent).
    """
    messages: list[dict] = [{"role": "user", "content": question}]
    for _ in range(max_turns):
        reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=max_tokens)
        choice = reply.choices[0]
        calls = choice.message.tool_calls or []
        if choice.finish_reason != "tool_calls" or not calls:
            return choice.message.content or "", messages
        messages.append({
            "role": "assistant",
            "content": choice.message.content,  # None when the answer is only tool calls
            "tool_calls": [{"id": c.id, "type": "function",
                            "function": {"name": c.function.name, "arguments": c.function.arguments}} for c in calls],
        })
        for call in calls:
            print(f"tool call {call.id}: {call.function.name}({call.function.arguments})")
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": run_tool(call.function.name, call.function.arguments)})
    raise RuntimeError(f"no final answer after {max_turns} turns")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=int(os.environ.get("KESTREL_PORT", "8000")),
                        help="port of a kestrel-trio server on 127.0.0.1 (default: $KESTREL_PORT, else 8000)")
    parser.add_argument("--base-url", help="the server's OpenAI API base URL (default: http://127.0.0.1:PORT/v1)")
    parser.add_argument("--api-key", default=os.environ.get("KESTREL_API_KEY", "unused"),
                        help="the server's --api-key (default: $KESTREL_API_KEY)")
    parser.add_argument("--model", help="model id (default: the server's first model)")
    parser.add_argument("--question", default="What is the weather in Paris right now?")
    parser.add_argument("--max-tokens", type=int, default=256, help="most tokens per answer (default 256)")
    args = parser.parse_args()
    base_url = args.base_url or f"http://127.0.0.1:{args.port}/v1"
    with openai.OpenAI(base_url=base_url, api_key=args.api_key) as client:
        model = args.model or client.models.list().data[0].id
        text, _ = run_agent(client, model, args.question, max_tokens=args.max_tokens)
    print(text)


if __name__ == "__main__":
    main()
