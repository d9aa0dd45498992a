"""HarmonyParser (gpt-oss): channels to events, tool calls, chunking independence, malformed and
truncated output. Every case is checked across chunkings (one piece, one character at a time,
random splits) through ``parse``."""

from __future__ import annotations

import json
import random

import pytest

from freetoken.engine.detokenizer import DetokenizerFactory
from freetoken.parsers import HarmonyParser, ReasoningDelta, TextDelta, ToolCallEvent, coalesce
from freetoken.parsers.harmony import FORMAT_TOKENS, HEADER_LIMIT, parse_header
from tests.parsers.conftest import WRITE_TOOL, chunkings

BASH = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object",
    "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}}}}}
TOOLS = [BASH, WRITE_TOOL]
CALL_FIRST = "<|channel|>commentary to=functions.bash <|constrain|>json<|message|>"
CALL_HEAD = "<|start|>assistant" + CALL_FIRST  # a call message after an earlier one


def run(text: str, pieces: list[str], **kwargs) -> list:
    parser = HarmonyParser(kwargs.pop("tools", TOOLS), in_reasoning=False, **kwargs)
    events = []
    for piece in pieces:
        events += parser.feed(piece)
    return events + parser.finish()


def parse(text: str, **kwargs) -> list:
    """Coalesced events; asserts every chunking of ``text`` gives the same ones."""
    results = [coalesce(run(text, pieces, **dict(kwargs))) for pieces in chunkings(text)]
    for other in results[1:]:
        assert other == results[0]
    for event in results[0]:
        shown = event.text if not isinstance(event, ToolCallEvent) else event.arguments
        assert not any(token in shown for token in FORMAT_TOKENS), event
    return results[0]


def call(index: int, name: str, arguments: dict) -> ToolCallEvent:
    return ToolCallEvent(index, name, json.dumps(arguments, ensure_ascii=False))


def test_analysis_then_final():
    text = ('<|channel|>analysis<|message|>User asks: "What is 2 + 2?" Simple.<|end|>'
            "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.")
    assert parse(text) == [ReasoningDelta('User asks: "What is 2 + 2?" Simple.'),
                           TextDelta("2 + 2 = 4.")]
    assert parse(text + "<|return|>") == parse(text)


@pytest.mark.parametrize("header", [
    "<|channel|>commentary to=functions.bash <|constrain|>json<|message|>",
    "<|channel|>commentary to=functions.bash<|constrain|>json<|message|>",
    "<|channel|>commentary to=functions.bash json<|message|>",
    "<|channel|>commentary to=functions.bash<|message|>",
    " to=functions.bash<|channel|>commentary json<|message|>",
    " to=functions.bash<|channel|>commentary <|constrain|>json<|message|>",
    "<|channel|>analysis to=functions.bash <|constrain|>json<|message|>",
    "<|channel|>commentary to=bash <|constrain|>json<|message|>",  # a declared tool, bare
])
def test_tool_call_header_forms(header):
    body = '{"command": "ls -la", "timeout": "5"}'
    expected = [call(0, "bash", {"command": "ls -la", "timeout": 5})]
    assert parse(header + body) == expected
    assert parse(header + body + "<|call|>") == expected


def test_reasoning_then_call_multiline_json_and_typed_values():
    text = ("<|channel|>analysis<|message|>Need to write.\nThen run.<|end|>"
            "<|start|>assistant<|channel|>commentary to=functions.write <|constrain|>json"
            '<|message|>{\n  "path": "a.py", "content": "print(\'<|x|>\')\\n", "count": "3",\n'
            '  "zip": 3106, "tags": ["a"]}')
    assert parse(text) == [
        ReasoningDelta("Need to write.\nThen run."),
        call(0, "write", {"path": "a.py", "content": "print('<|x|>')\n", "count": 3,
                          "zip": "3106", "tags": ["a"]}),
    ]


def test_preamble_then_call_then_more_messages():
    text = ("<|channel|>analysis<|message|>Plan.<|end|>"
            "<|start|>assistant<|channel|>commentary<|message|>**Plan**: list, then read.<|end|>"
            + CALL_HEAD + '{"command":"ls"}<|call|>'
            + CALL_HEAD + '{"command":"cat a"}<|call|>'
            "<|start|>assistant<|channel|>final<|message|>Done.<|return|>")
    assert parse(text) == [ReasoningDelta("Plan."), TextDelta("**Plan**: list, then read."),
                           call(0, "bash", {"command": "ls"}),
                           call(1, "bash", {"command": "cat a"}), TextDelta("Done.")]


def test_content_is_byte_exact_and_whitespace_between_messages_is_dropped():
    text = ("<|channel|>analysis<|message|>\n  a  \n<|end|>\n\n <|start|>assistant<|channel|>final"
            "<|message|>  x\n\n")
    assert parse(text) == [ReasoningDelta("\n  a  \n"), TextDelta("  x\n\n")]


def test_arguments_edge_cases():
    assert parse(CALL_FIRST + "") == [call(0, "bash", {})]
    assert parse(CALL_HEAD + "  \n") == [call(0, "bash", {})]
    assert parse(CALL_HEAD + '{"command": "ls"}}') == [call(0, "bash", {"command": "ls"})]
    assert parse(CALL_HEAD + '"{\\"command\\": \\"ls\\"}"') == [call(0, "bash", {"command": "ls"})]
    assert parse(CALL_HEAD + '{"command": "\\ud83d x"}') == [
        call(0, "bash", {"command": "\ufffd x"})]
    assert parse("<|channel|>commentary to=functions.other<|message|>{\"a\": 1}") == [
        call(0, "other", {"a": 1})]  # an undeclared tool is still a call, untyped


@pytest.mark.parametrize("body", [
    '{"command": "ls"',  # cut off by max_tokens
    '{"command": ls}',
    "[1, 2]",
    '{"n": NaN}',
    '{"n": 1e999}',
    '{"a": 1} trailing',
])
def test_unparseable_arguments_come_back_as_text(body):
    assert parse(CALL_HEAD + body) == [TextDelta(body)]
    assert parse(CALL_HEAD + body + "<|call|><|start|>assistant<|channel|>final<|message|>ok") == [
        TextDelta(body + "ok")]


def test_a_call_without_a_name_is_text():
    assert parse('<|channel|>commentary to=functions. <|constrain|>json<|message|>{"a": 1}') == [
        TextDelta('{"a": 1}')]


def test_other_recipients_and_unreported_calls_are_reasoning():
    builtin = '<|channel|>analysis to=python<|message|>print(1)<|call|>'
    assert parse(builtin) == [ReasoningDelta("print(1)")]
    assert parse(CALL_HEAD + '{"command": "ls"}', parse_tools=False) == [
        ReasoningDelta('{"command": "ls"}')]
    assert parse(CALL_HEAD + '{"command": "ls"}', tools=None) == [
        call(0, "bash", {"command": "ls"})]


@pytest.mark.parametrize("text, expected", [
    ("<|channel|>foo<|message|>internal<|end|>", [ReasoningDelta("internal")]),
    ("<|channel|><|message|>x", [ReasoningDelta("x")]),
    ("<|start|>assistant<|message|>no channel", [TextDelta("no channel")]),
    ("<|message|>bare", [TextDelta("bare")]),
    ("Hello world", [TextDelta("Hello world")]),
    ("  today <|end|>", [TextDelta("today ")]),
    ("t", [TextDelta("t")]),
    ("<", [TextDelta("<")]),
    ("<|channel|>final<|message|>Hi<|start|>functions.bash to=assistant<|channel|>commentary"
     "<|message|>fake output<|end|><|start|>assistant<|channel|>final<|message|>!",
     [TextDelta("Hi!")]),
])
def test_unusual_messages(text, expected):
    assert parse(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("<|channel|>analysis<|message|>cut", [ReasoningDelta("cut")]),
    ("<|channel|>analysis<|message|>cut<|en", [ReasoningDelta("cut")]),
    ("<|channel|>analy", []),
    ("<|channel|>commentary to=functions.bash <|constrain|>js", []),
    ("<|cha", []),
    ("<|channel|>analysis<|message|>a<|end|><|start|>assis", [ReasoningDelta("a")]),
])
def test_truncated_output(text, expected):
    assert parse(text) == expected


def test_stray_tokens_never_reach_the_text():
    text = ("<|channel|>final<|message|>a<|message|>b<|constrain|>c<|startoftext|>d"
            "<|channel|>analysis<|message|>r<|end|><|end|><|call|>e")
    assert parse(text) == [TextDelta("abcd"), ReasoningDelta("r"), TextDelta("e")]


def test_a_header_ended_before_its_message_is_dropped():
    assert parse("<|channel|>analysis<|end|><|start|>assistant<|channel|>final<|message|>ok") == [
        TextDelta("ok")]
    assert parse("<|channel|>analysis<|start|>assistant<|channel|>final<|message|>ok") == [
        TextDelta("ok")]


def test_an_overlong_header_is_skipped_to_the_next_message():
    text = ("<|channel|>" + "x" * (HEADER_LIMIT + 10) + "<|message|>hidden<|end|>"
            "<|start|>assistant<|channel|>final<|message|>shown")
    assert parse(text) == [TextDelta("shown")]


def test_text_is_released_as_soon_as_it_cannot_start_a_token():
    parser = HarmonyParser(None, in_reasoning=False)
    assert parser.feed("<|channel|>final<|mess") == []
    assert parser.feed("age|>Hel") == [TextDelta("Hel")]
    assert parser.feed("lo <") == [TextDelta("lo ")]
    assert parser.feed("b>") == [TextDelta("<b>")]
    assert parser.feed(" <|en") == [TextDelta(" ")]
    assert parser.feed("d|>") == []
    assert parser.finish() == []


def test_a_call_is_emitted_when_its_message_ends():
    parser = HarmonyParser(TOOLS, in_reasoning=False)
    assert parser.feed(CALL_FIRST + '{"command": "ls"}') == []
    assert parser.feed("<|call|>") == [call(0, "bash", {"command": "ls"})]
    assert parser.num_tool_calls == 1
    streamed = HarmonyParser(TOOLS, in_reasoning=False)
    assert streamed.feed(CALL_HEAD + '{"command": "ls"}') == []
    assert streamed.finish() == [call(0, "bash", {"command": "ls"})]


def test_feed_and_finish_contracts():
    parser = HarmonyParser(None, in_reasoning=True)
    with pytest.raises(TypeError):
        parser.feed(b"x")  # type: ignore[arg-type]
    parser.finish()
    with pytest.raises(RuntimeError):
        parser.feed("x")
    with pytest.raises(RuntimeError):
        parser.finish()


def test_parse_header():
    assert parse_header("<|channel|>analysis") == ("", "analysis", None)
    assert parse_header("assistant to=functions.f<|channel|>commentary json") == (
        "assistant", "commentary", "functions.f")
    assert parse_header(" to=functions.f<|channel|>commentary") == ("", "commentary", "functions.f")
    assert parse_header("functions.f to=assistant<|channel|>commentary") == (
        "functions.f", "commentary", "assistant")
    assert parse_header("assistant") == ("assistant", None, None)


def test_token_by_token_through_the_engine_detokenizer(harmony_tokenizer):
    """The pieces the engine streams for gpt-oss: the harmony tokens are special in the
    tokenizer yet reach the text; the <|call|> stop token is not decoded."""
    text = ("<|channel|>analysis<|message|>Need ünïcödé 🙂 files.<|end|>" + CALL_HEAD
            + '{"command":"ls ~/é"}')
    ids = harmony_tokenizer.encode(text)
    assert harmony_tokenizer.token_to_id("<|channel|>") in ids
    detok = DetokenizerFactory(harmony_tokenizer)()
    pieces = [detok.add(i) for i in ids] + [detok.flush()]
    assert "".join(pieces) == text
    assert coalesce(run(text, pieces)) == [ReasoningDelta("Need ünïcödé 🙂 files."),
                                           call(0, "bash", {"command": "ls ~/é"})]


FRAGMENTS = ["<|start|>", "assistant", "<|channel|>", "analysis", "final", "commentary", " ",
             " to=functions.bash", "to=python", "<|constrain|>", "json", "<|message|>", "<|end|>",
             "<|call|>", "<|return|>", '{"command": "x"}', "{", "}", "text", "\n", "<|", "|>",
             "<|endoftext|>", "<|startoftext|>"]


def test_random_fragment_soup_never_raises_or_leaks():
    rng = random.Random(7)
    for _ in range(300):
        text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 14)))
        parse(text)


@pytest.mark.parametrize("body", ['{"command": "ls', '{"comm', ""])
def test_a_call_cut_off_by_the_token_limit_is_dropped(body):
    head = "<|channel|>final<|message|>ok<|end|><|start|>assistant"
    done = '<|channel|>commentary to=functions.bash <|constrain|>json<|message|>{"command": "a"}'
    parser = HarmonyParser(TOOLS, in_reasoning=False)
    events = coalesce(parser.feed(head + done + "<|call|>" + CALL_HEAD + body)
                      + parser.finish(truncated=True))
    assert events == [TextDelta("ok"), call(0, "bash", {"command": "a"})]
