"""Constrained decoding, sans-IO: grammars over the real Qwen3 tokenizer, masks, triggers, reasoning, the sampler.

The "model" here is a random logits vector per step (a seeded generator): like
random weights, it never chooses to close a string, so every schema bounds
its strings, arrays and numbers.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from kestrel_trio._model import KVCache
from kestrel_trio.errors import BadRequestError
from kestrel_trio.text import Sampler, SamplingParams, Tokenizer
from kestrel_trio.text.constraints import grammar as g
from kestrel_trio.text.constraints.constraint import compile_constraint, grammar_vocab, start_masks
from kestrel_trio.text.generation import Generation

VOCAB = 151936  # Qwen3's logits rows (the tokenizer has 151,669 ids; the rest is padding)

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]$"},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["name", "age", "tags", "code"],
}


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_demo()


@pytest.fixture(scope="module")
def vocab(tokenizer):
    return grammar_vocab(tokenizer, VOCAB)


def constraint_for(vocab, grammar: str, **options):
    return compile_constraint(vocab, grammar, kind="test", param="response_format", **options)


def generate(tokenizer, constraint, *, seed: int, temperature: float = 1.0, max_tokens: int = 200,
             script: list[int] = (), ignore_eos: bool = False) -> Generation:
    """Run a generation on random logits; ``script`` tokens win the first steps by a wide margin."""
    rng = np.random.default_rng(seed)
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed, ignore_eos=ignore_eos)
    gen = Generation([1, 2, 3], params, tokenizer=tokenizer, eos_token_ids=tokenizer.eos_token_ids,
                     cache=KVCache(1, 1, 1), vocab_size=VOCAB,
                     constraint=constraint)
    while gen.finish_reason is None:  # the first advance takes the prompt's only chunk and samples too
        logits = rng.standard_normal(VOCAB).astype(np.float32) * 3  # [vocab]
        step = len(gen.generated_ids)
        if step < len(script):
            logits[script[step]] = logits.max() + 50
        gen.advance(logits)
    return gen


def text_of(tokenizer, gen: Generation) -> str:
    return tokenizer.decode(gen.generated_ids)


def check_person(value: dict) -> None:
    assert set(value) <= set(PERSON["properties"]) and {"name", "age", "tags", "code"} <= set(value)
    assert isinstance(value["name"], str) and len(value["name"]) <= 6
    assert type(value["age"]) is int and 0 <= value["age"] <= 120
    assert isinstance(value["tags"], list) and len(value["tags"]) <= 3 and set(value["tags"]) <= {"a", "b", "c"}
    assert len(value["code"]) == 3 and value["code"][:2].isupper() and value["code"][2].isdigit()
    if "score" in value:
        assert 0 <= value["score"] <= 1


@pytest.mark.parametrize("temperature", [1.0, 0.0])
@pytest.mark.parametrize("seed", range(4))
def test_random_logits_under_a_schema_always_give_valid_json(tokenizer, vocab, seed, temperature):
    gen = generate(tokenizer, constraint_for(vocab, g.json_schema_grammar(PERSON)), seed=seed, temperature=temperature)
    assert gen.finish_reason == "stop"
    assert gen.generated_ids[-1] in tokenizer.eos_token_ids
    text = text_of(tokenizer, gen)
    check_person(json.loads(text))
    assert ", " in text and ": " in text and "\n" not in text  # the one layout: {"a": 1, "b": 2}


def test_max_tokens_inside_a_structure_ends_with_length_and_a_prefix(tokenizer, vocab):
    script = tokenizer.encode('{"')  # a key: random logits never close its string
    gen = generate(tokenizer, constraint_for(vocab, g.json_object_grammar()), seed=0, max_tokens=12, script=script)
    assert gen.finish_reason == "length" and len(gen.generated_ids) == 12
    text = text_of(tokenizer, gen)
    assert text.startswith('{"')
    with pytest.raises(ValueError):
        json.loads(text)


def test_eos_is_allowed_exactly_where_the_grammar_accepts(tokenizer, vocab):
    state = constraint_for(vocab, g.json_schema_grammar({"type": "integer", "minimum": 0, "maximum": 99})).start()
    eos = sorted(tokenizer.eos_token_ids)
    assert len(eos) == 2  # <|endoftext|> and <|im_end|>: both stand for "end"
    assert not state.token_mask()[eos].any()
    state.consume(tokenizer.encode("4")[0])
    mask = state.token_mask()
    assert mask[eos].all() and mask[tokenizer.encode("2")[0]]  # 4 may end or go on to 42
    state.consume(tokenizer.encode("2")[0])
    mask = state.token_mask()
    assert mask[eos].all() and np.flatnonzero(mask).tolist() == eos  # 42 is complete: only the end
    state.consume(eos[1])
    assert state.ended and not state.active


def test_a_complete_answer_stops_even_with_ignore_eos(tokenizer, vocab):
    gen = generate(tokenizer, constraint_for(vocab, g.choice_grammar(["yes", "no"])), seed=3, ignore_eos=True)
    assert gen.finish_reason == "stop" and text_of(tokenizer, gen) in ("yes", "no")


def test_the_mask_comes_before_temperature_and_truncation():
    logits = np.array([5.0, 4.0, 3.0, 2.0, 1.0], dtype=np.float32)
    allowed = np.array([False, False, True, True, False])
    for params in (SamplingParams(temperature=0.0), SamplingParams(top_k=1), SamplingParams(top_p=0.01),
                   SamplingParams(min_p=0.9)):
        sampler = Sampler(params, vocab_size=5)
        assert {sampler.sample(logits, [], [], allowed) for _ in range(20)} == {2}, params
    scored = Sampler(SamplingParams(logprobs=5), vocab_size=5).sample_scored(logits, [], [], allowed)[1]
    assert {token for token, _ in scored.top if np.isfinite(_)} == {2, 3}  # the grammar's distribution


def test_a_trigger_turns_the_constraint_on_for_each_call(tokenizer, vocab):
    grammar = g.tool_calls_grammar([("f", {"type": "object", "properties": {"n": {"type": "integer"}}})], "auto",
                                   special_tags=True)
    state = constraint_for(vocab, grammar, trigger=b"<tool_call>").start()

    def feed(text: str) -> None:
        for token in tokenizer.encode(text):
            if state.active:
                assert state.token_mask()[token], (text, tokenizer.id_to_token(token))
            state.consume(token)

    feed("Let me see. ")
    assert not state.active
    feed("<tool_call>")
    assert state.active
    assert not state.token_mask()[tokenizer.encode("x")[0]]
    feed('\n{"name": "f", "arguments": {"n": 3}}\n</tool_call>')
    assert not state.active and not state.ended  # free text again, waiting for the next call
    feed("\n<think>I might <tool_call>")  # inside reasoning a tag is just text
    assert not state.active
    feed("</think>\n\n<tool_call>")
    assert state.active


def test_an_answer_after_reasoning_is_constrained_and_the_reasoning_is_free(tokenizer, vocab):
    constraint = constraint_for(vocab, g.json_schema_grammar(PERSON), in_reasoning=True)
    script = tokenizer.encode("Hmm, let me think: <tool_call> {\n</think>\n\n")
    gen = generate(tokenizer, constraint, seed=5, script=script)
    text = tokenizer.decode(gen.generated_ids, skip_special_tokens=False)
    reasoning, answer = text.split("</think>")
    assert reasoning == "Hmm, let me think: <tool_call> {\n"
    check_person(json.loads(answer.removeprefix("\n\n").removesuffix("<|im_end|>").removesuffix("<|endoftext|>")))


def test_masks_computed_beside_the_step_equal_masks_computed_alone(tokenizer, vocab):
    constraint = constraint_for(vocab, g.json_schema_grammar(PERSON))
    prefixes = ['{"name": "ab', '{"name": "", "age": 1', '{']
    ahead, alone = [constraint.start() for _ in prefixes], [constraint.start() for _ in prefixes]
    for prefix, a, b in zip(prefixes, ahead, alone):
        for token in tokenizer.encode(prefix):
            a.consume(token)
            b.consume(token)
    start_masks(ahead)
    for a, b in zip(ahead, alone):
        np.testing.assert_array_equal(a.token_mask(), b.token_mask())
        seconds, _wait = a.take_timing()
        assert seconds > 0 and a.take_timing() is None


def test_objects_with_properties_are_closed_unless_they_say_otherwise():
    schema = {"type": "object", "properties": {
        "properties": {"type": "object", "properties": {"x": {"type": "string"}}},  # a key named "properties"
        "open": {"type": "object", "properties": {}, "additionalProperties": True},
        "any": {"type": "object"},
        "merged": {"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]},
    }, "$defs": {"D": {"properties": {"d": {}}}}}
    closed = g.close_objects(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["properties"]["additionalProperties"] is False
    assert "additionalProperties" not in closed["properties"]["properties"]["properties"]  # the map itself
    assert closed["properties"]["open"]["additionalProperties"] is True
    assert "additionalProperties" not in closed["properties"]["any"]
    assert all("additionalProperties" not in part for part in closed["properties"]["merged"]["allOf"])
    assert closed["$defs"]["D"]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the request's value is left alone


def test_property_names_that_allow_every_string_are_dropped_and_others_refused(vocab):
    """zod's record (Claude Code's TaskCreate.metadata) writes propertyNames {"type": "string"}: no constraint."""
    record = {"type": "object", "propertyNames": {"type": "string"}, "additionalProperties": {}}
    schema = {"type": "object", "properties": {"metadata": record}, "required": ["metadata"]}
    assert "propertyNames" not in g.close_objects(schema)["properties"]["metadata"]
    compile_constraint(vocab, g.json_schema_grammar(schema), kind="json_schema", param="s", schema=schema)
    narrowed = {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}}
    assert g.close_objects(narrowed)["propertyNames"] == {"pattern": "^[a-z]+$"}
    with pytest.raises(BadRequestError) as caught:
        compile_constraint(vocab, g.json_schema_grammar(narrowed), kind="json_schema", param="s", schema=narrowed)
    assert caught.value.param == "s.propertyNames"


@pytest.mark.parametrize("schema, param", [
    ({"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}},
     "s.properties.tags.uniqueItems"),
    ({"$defs": {"T": {"type": "string", "format": "colour"}}, "$ref": "#/$defs/T"}, "s.$defs.T.format"),
    ({"type": "object", "properties": {"a": {"anyOf": [{"type": "string", "pattern": "(?=x)"}]}}},
     "s.properties.a.anyOf[0].pattern"),
    ({"type": "integer", "minimum": 5, "maximum": 1}, "s.minimum"),
    ({"type": "object", "properties": {"v": {"not": {"type": "null"}}}}, "s.properties.v.not"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "s"),
])
def test_a_schema_that_cannot_be_enforced_names_its_keyword(vocab, schema, param):
    with pytest.raises(BadRequestError) as caught:
        compile_constraint(vocab, g.json_schema_grammar(schema), kind="json_schema", param="s", schema=schema)
    assert caught.value.param == param
    assert param.rsplit(".", 1)[-1].split("[")[0] in caught.value.message or param == "s"


def test_bad_regexes_and_grammars_are_refused_with_their_field(vocab):
    for grammar, field in ((g.regex_grammar("[a-"), "structured_outputs.regex"),
                           (g.lark_grammar("start: nothing_defined"), "structured_outputs.grammar")):
        with pytest.raises(BadRequestError) as caught:
            compile_constraint(vocab, grammar, kind="x", param=field)
        assert caught.value.param == field


def test_gbnf_and_lark_grammars_both_compile(tokenizer, vocab):
    for text in ('root ::= "yes" | "no"', 'start: "yes" | "no"'):
        gen = generate(tokenizer, constraint_for(vocab, g.lark_grammar(text)), seed=1)
        assert text_of(tokenizer, gen) in ("yes", "no")


def test_the_vocabulary_is_built_once_per_tokenizer(tokenizer, vocab):
    assert grammar_vocab(tokenizer, VOCAB) is vocab
    assert vocab.special_token("<tool_call>") == tokenizer.token_to_id("<tool_call>")
    assert vocab.special_token("hello") is None


TOOLS = [("point", {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}},
                    "required": ["x"]}),
         ("tag", {"$defs": {"T": {"enum": ["a", "b"]}}, "type": "object",
                  "properties": {"t": {"$ref": "#/$defs/T"}}, "required": ["t"]})]


def calls_in(text: str) -> list[dict]:
    blocks = [b.split("</tool_call>")[0] for b in text.split("<tool_call>")[1:]]
    return [json.loads(block.strip()) for block in blocks]


@pytest.mark.parametrize("seed", range(3))
def test_required_calls_are_valid_and_at_most_eight(tokenizer, vocab, seed):
    constraint = constraint_for(vocab, g.tool_calls_grammar(TOOLS, "required", special_tags=True))
    gen = generate(tokenizer, constraint, seed=seed, temperature=0.0 if seed else 1.0, max_tokens=400)
    assert gen.finish_reason == "stop"
    calls = calls_in("<tool_call>\n" + tokenizer.decode(gen.generated_ids, skip_special_tokens=False))
    assert 1 <= len(calls) <= g.MAX_CALLS
    for call in calls:  # a local $ref inside one function's parameters still resolves
        assert call in ({"name": "point", "arguments": {"x": call["arguments"].get("x")}},
                        {"name": "tag", "arguments": {"t": call["arguments"].get("t")}})
        assert call["arguments"].get("x") in range(10) or call["arguments"].get("t") in ("a", "b")


def test_an_answer_or_tool_calls(tokenizer, vocab):
    answer = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    constraint = constraint_for(vocab, g.tool_calls_grammar(TOOLS, "answer", special_tags=True, answer=answer))
    as_call = generate(tokenizer, constraint, seed=2, script=tokenizer.encode("<tool_call>"))
    text = tokenizer.decode(as_call.generated_ids, skip_special_tokens=False)
    assert as_call.finish_reason == "stop" and calls_in(text)
    as_json = generate(tokenizer, constraint, seed=2, script=tokenizer.encode('{"'))
    assert json.loads(text_of(tokenizer, as_json)) in ({"ok": True}, {"ok": False})
