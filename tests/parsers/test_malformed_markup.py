"""Malformed tool markup never raises: the call is parsed or returned as plain text."""

from __future__ import annotations

import pytest

from freetoken.parsers import OutputParser
from freetoken.parsers import ReasoningDelta as R
from freetoken.parsers import TextDelta as T
from freetoken.parsers import ToolCallEvent as Call
from freetoken.parsers.events import coalesce

GOOD = '<tool_call>\n{"name": "ok", "arguments": {}}\n</tool_call>'


@pytest.mark.parametrize(
    "bad",
    [
        "<tool_call>\n{not json}\n</tool_call>",
        '<tool_call>\n{"arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "x", "arguments": [1]}\n</tool_call>',
        '<tool_call>\n{"name": "x", "arguments": "not json"}\n</tool_call>',
        "<tool_call>\njust words\n</tool_call>",
        "<tool_call></tool_call>",
        "<tool_call>\n<function=f>\n<param=a>\n1\n</param>\n</function>\n</tool_call>",
        "<tool_call>\n<function=f>\nstray words\n</function>\n</tool_call>",
        "<tool_call>\n<function=bad name\n>\n</function>\n</tool_call>",
        "<tool_call>\n<function=f>\n</function>\ntrailing junk</tool_call>",
    ],
)
def test_malformed_call_is_text_and_the_next_call_still_parses(parse, bad):
    assert parse("Before.\n" + bad + "\n" + GOOD + "\nAfter.") == [
        T("Before.\n" + bad),
        Call(0, "ok", "{}"),
        T("After."),
    ]


def test_duplicated_closing_tags_are_dropped(parse):
    text = GOOD + "</tool_call>\n</tool_call>\nDone."
    assert parse(text) == [Call(0, "ok", "{}"), T("Done.")]
    xml = "<tool_call>\n<function=f>\n</function>\n</function>\n</tool_call>\n</tool_call>"
    assert parse(xml) == [Call(0, "f", "{}")]


def test_unterminated_but_complete_calls_are_parsed_at_finish(parse):
    assert parse('Go.\n<tool_call>\n{"name": "a", "arguments": {"k": 1}}\n') == [T("Go."), Call(0, "a", '{"k": 1}')]
    assert parse('<tool_call>\n{"name": "a", "arguments": {}}\n</tool_') == [Call(0, "a", "{}")]
    assert parse("<tool_call>\n<function=f>\n<parameter=a>\nv\n</parameter>\n") == [Call(0, "f", '{"a": "v"}')]
    assert parse("<function=f>\n<parameter=a>\nv\n</parameter>\n</function>") == [Call(0, "f", '{"a": "v"}')]


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "a", "arguments": {"k": "unterminated',
        '<tool_call>\n{"name": "a", "argu',
        "<tool_call>\n<function=f>\n<parameter=a>\nvalue never closed",
        "<tool_call>\n",
        "<tool_call>",
    ],
)
def test_unterminated_incomplete_calls_are_text_at_finish(parse, text):
    assert parse("Hi\n" + text) == [T("Hi\n" + text)]


def test_bare_function_tag_in_prose_is_text(parse):
    assert parse("Use <function=name> to call.") == [T("Use <function=name> to call.")]
    assert parse("Say <function=\nnope") == [T("Say <function=\nnope")]


def test_cut_off_tag_prefix_at_finish_is_dropped(parse):
    assert parse("Answer.\n<tool_") == [T("Answer.\n")]
    assert parse("a < b <") == [T("a < b <")]


def test_feed_after_finish_and_bad_input_raise():
    parser = OutputParser(None, in_reasoning=False)
    with pytest.raises(TypeError) as err:
        parser.feed(b"bytes")
    assert str(err.value) == "feed() takes a str, got bytes"
    assert parser.finish() == []
    with pytest.raises(RuntimeError) as err:
        parser.feed("x")
    assert str(err.value) == "OutputParser.feed() called after finish()"
    with pytest.raises(RuntimeError) as err:
        parser.finish()
    assert str(err.value) == "OutputParser.finish() called twice"


def test_reasoning_then_malformed_call(parse):
    assert parse("r\n</think>\n\n<tool_call>{oops}</tool_call>", in_reasoning=True) == [
        R("r"),
        T("<tool_call>{oops}</tool_call>"),
    ]


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "a", "arguments": {"k": "unterminated',
    '<tool_call>\n{"name": "a", "argu',
    "<tool_call>\n<function=f>\n<parameter=a>\nvalue never closed",
    "<tool_call>",
])
def test_calls_cut_off_by_the_token_limit_are_dropped(text):
    """A call the token limit cut is neither a call nor answer text (the finish reason says
    length); the text before it and complete calls stay."""
    done = '<tool_call>\n{"name": "a", "arguments": {"k": 1}}\n</tool_call>\n'
    parser = OutputParser(None, in_reasoning=False)
    events = coalesce(parser.feed("Hi\n" + done + text) + parser.finish(truncated=True))
    assert events == [T("Hi"), Call(0, "a", '{"k": 1}')]
    parser = OutputParser(None, in_reasoning=False)  # ended otherwise: the malformed call is text
    assert coalesce(parser.feed("Hi\n" + text) + parser.finish()) == [T("Hi\n" + text)]
