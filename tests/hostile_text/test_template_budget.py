"""Issue 49 items 2 and 3: a chat template cannot hold a text worker forever nor build a 100 MB prompt.

Nested loops of 10^5 x 10^5 in tokenizer.chat_template occupied both text workers for good while /health said
ok; a template over its render budget (loop iterations, time, output size) now fails its request with a 400
naming the budget, and the workers serve the next request.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from hostile_text_kit import copy_fixture

from kestrel_trio.model import load_model
from kestrel_trio.text.tokens.chat_template import ChatTemplate
from server_kit import assert_envelope, fetch, running_server

NESTED = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
HOSTILE = [
    NESTED,
    "{% set r = range(100000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}",
    "{{ 'x' * 100000000 }}",
    "{% set ns = namespace(s='xx') %}{% for i in range(26) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
    "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
]
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


@pytest.mark.parametrize("source", HOSTILE)
def test_a_template_over_budget_is_a_400(source: str) -> None:
    from kestrel_trio.errors import BadRequestError

    with pytest.raises(BadRequestError) as caught:
        ChatTemplate(source).render([{"role": "user", "content": "Hi"}])
    assert "budget" in caught.value.message and caught.value.param == "messages"


async def test_a_hanging_template_frees_the_workers(tmp_path: Path) -> None:
    model = load_model(copy_fixture(tmp_path / "m", chat_template=NESTED + "{{ messages[0].content }}"))
    with trio.fail_after(120):
        async with running_server(model) as server:
            answers = []
            async with trio.open_nursery() as nursery:  # more than the two text workers at once
                for _ in range(3):
                    nursery.start_soon(lambda: _append(answers, fetch(server.port, "POST", "/v1/chat/completions",
                                                                      CHAT)))
            tokenized = await fetch(server.port, "POST", "/tokenize", {"prompt": "hello"})
            health = await fetch(server.port, "GET", "/health")
    for answer in answers:
        error = assert_envelope(answer, 400)
        assert "budget" in error["message"]
    assert tokenized.status == 200 and health.status == 200


async def _append(answers: list, request) -> None:
    answers.append(await request)
