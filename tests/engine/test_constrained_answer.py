"""The JSON-answer grammar (structured outputs) against llguidance and the real output parser.

Random walks under the mask end in JSON that satisfies the schema, after free reasoning when
the prompt opened a think block (harmony: after an optional analysis message); with tool calls
as the alternative, a walk is either an answer or calls; bad schemas are refused with
llguidance's message.
"""

from __future__ import annotations

import json

import pytest
import torch

from freetoken.constrain import GrammarError, JsonAnswerGrammar, json_answer_grammar
from freetoken.constrain import tool_call_grammar
from freetoken.constrain.matcher import GrammarCompiler, check_answer_grammar
from freetoken.core import SamplingParams
from freetoken.parsers import parse_output
from freetoken.parsers.events import ReasoningDelta, TextDelta, ToolCallEvent
from tests.engine.answer_schemas import NESTED, PERSON, check_answer
from tests.engine.constrained_schemas import TOOLS, check_call
from tests.engine.helpers import ENDOFTEXT, IM_END, tokenizer

EOS = (IM_END, ENDOFTEXT)
THINK_END = 8217


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    return GrammarCompiler(tokenizer(), EOS)


def walk(compiler, spec, seed: int, limit: int = 400) -> tuple[str, bool]:
    """Sample from random logits under the mask until EOS; (text without EOS, ended by EOS)."""
    matcher = compiler.matcher(spec)
    gen = torch.Generator().manual_seed(seed)
    ids = []
    for _ in range(limit):
        logits = torch.randn(tokenizer().vocab_size, generator=gen)
        token = matcher.sample(logits, SamplingParams(temperature=1.0), gen).token_id
        if token in EOS:
            return tokenizer().decode(ids), True
        ids.append(token)
    return tokenizer().decode(ids), False


@pytest.mark.parametrize("schema", [PERSON, NESTED], ids=["person", "nested"])
def test_random_walks_are_valid_answers(compiler, schema):
    for seed in range(8):
        text, ended = walk(compiler, json_answer_grammar(schema, "json"), seed)
        assert ended and text.startswith("{") and ", " in text
        check_answer(text, schema)


def test_any_object_is_a_json_object(compiler):
    spec = json_answer_grammar(None, "json")
    assert json.loads(spec.schema) == {"type": "object"}
    matcher = compiler.matcher(spec)
    text = '{"a": [1, {"b": null}], "c": "d"}'
    for token in tokenizer().encode(text):
        matcher.advance(token)
    assert set(EOS) <= set(matcher.allowed(tokenizer().vocab_size).nonzero().flatten().tolist())
    refused = compiler.matcher(spec)
    with pytest.raises(GrammarError, match="^JSON-answer grammar rejected token"):
        for token in tokenizer().encode("[1]"):
            refused.advance(token)


def test_reasoning_is_free_then_the_answer(compiler):
    spec = json_answer_grammar(PERSON, "json", reasoning=True)
    matcher = compiler.matcher(spec)
    thought = "I think {\"a\": 1} is not the answer."
    for token in tokenizer().encode(thought) + [THINK_END] + tokenizer().encode("\n\n"):
        matcher.advance(token)
    answer = '{"name": "Al", "age": 3, "role": "user", "tags": ["x"]}'
    for token in tokenizer().encode(answer):
        matcher.advance(token)
    assert matcher.done or IM_END in matcher.allowed(tokenizer().vocab_size).nonzero().flatten()
    events = parse_output(thought + "</think>\n\n" + answer, None, in_reasoning=True)
    assert events == [ReasoningDelta(thought), TextDelta(answer)]


def test_harmony_answer_is_a_final_message(compiler):
    spec = json_answer_grammar(PERSON, "harmony", reasoning=True)
    text = compiler.grammar(spec)
    assert text.startswith("start: analysis? final\n")
    assert 'final: "<|channel|>" "final" "<|message|>" answer\n' in text
    answer = '{"name": "", "age": 120, "role": "admin", "tags": []}'
    text = f"<|channel|>analysis<|message|>Think.<|end|><|start|>assistant" \
           f"<|channel|>final<|message|>{answer}"
    matcher = compiler.matcher(spec)
    for token in tokenizer().encode(text):
        matcher.advance(token)
    assert IM_END in matcher.allowed(tokenizer().vocab_size).nonzero().flatten()
    for seed in range(4):  # the committed tokenizer writes the tags as text: no analysis here
        out, ended = walk(compiler, json_answer_grammar(PERSON, "harmony"), seed)
        assert ended and out.startswith("<|channel|>final<|message|>{")
        check_answer(out.removeprefix("<|channel|>final<|message|>"), PERSON)


def test_tool_calls_are_the_alternative(compiler):
    calls = tool_call_grammar(TOOLS, "json")
    spec = json_answer_grammar(PERSON, "json", calls=calls)
    kinds = set()
    for seed in range(16):
        text, ended = walk(compiler, spec, seed)
        assert ended
        events = parse_output(text, TOOLS, in_reasoning=False)
        if text.startswith("{"):
            kinds.add("answer")
            assert events == [TextDelta(text)]
            check_answer(text, PERSON)
        else:
            kinds.add("calls")
            assert events and all(isinstance(e, ToolCallEvent) for e in events)
            for event in events:
                check_call(event.name, event.arguments)
    assert kinds == {"answer", "calls"}


def test_bad_descriptions_and_schemas_are_refused():
    with pytest.raises(GrammarError, match="^the schema must be a JSON object$"):
        JsonAnswerGrammar("json", "[1]")
    with pytest.raises(GrammarError, match="^the schema is not JSON: "):
        JsonAnswerGrammar("json", "{")
    with pytest.raises(GrammarError, match="must have the answer's form and reasoning"):
        json_answer_grammar(PERSON, "json", calls=tool_call_grammar(TOOLS, "xml"))
    cases = [
        ({"type": "strin"}, "failed to compile JSON schema: Invalid type: strin"),
        ({"type": "object", "properties": {"a": {"minLength": "x"}}},
         "failed to compile JSON schema: Expected positive integer for 'minLength', got \"x\""),
        ({"$ref": "#/$defs/missing"},
         "failed to compile JSON schema: Pointer '/$defs/missing' does not exist"),
    ]
    for schema, error in cases:
        with pytest.raises(GrammarError) as info:
            check_answer_grammar(json_answer_grammar(schema, "json"))
        assert str(info.value) == f"the schema cannot be compiled into a grammar: {error}"
    check_answer_grammar(json_answer_grammar({"type": "object", "format": "x", "foo": 1}, "json"))


@pytest.mark.parametrize(("schema", "text"), [
    ({}, '[1, "a"]'),
    ({}, '"x"'),
    ({"type": "string", "maxLength": 5}, '"abc"'),
    ({"type": "array", "items": {"type": "integer"}}, "[1, 2]"),
], ids=["empty-array", "empty-string", "string", "array"])
def test_roots_other_than_objects_are_served(compiler, schema, text):
    matcher = compiler.matcher(json_answer_grammar(schema, "json"))
    for token in tokenizer().encode(text):
        matcher.advance(token)
    assert IM_END in matcher.allowed(tokenizer().vocab_size).nonzero().flatten().tolist()
