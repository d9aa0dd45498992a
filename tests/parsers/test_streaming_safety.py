"""Streaming safety: early release, no partial markup in text, chunking-independent events."""

from __future__ import annotations

import json
import random
import re

import pytest

from freetoken.parsers import OutputParser, ReasoningDelta, TextDelta, ToolCallEvent, coalesce


def test_text_is_released_as_soon_as_it_cannot_start_a_tag():
    parser = OutputParser([], in_reasoning=False)
    assert parser.feed("Hello") == [TextDelta("Hello")]
    assert parser.feed(" wor") == [TextDelta(" wor")]
    assert parser.feed("ld <") == [TextDelta("ld ")]
    assert parser.feed("b>") == [TextDelta("<b>")]
    assert parser.feed(" x <too") == [TextDelta(" x ")]
    assert parser.feed("l") == []
    assert parser.feed("s>") == [TextDelta("<tools>")]
    assert parser.feed("\n") == []
    assert parser.feed("next") == [TextDelta("\nnext")]
    assert parser.finish() == []


def test_partial_tags_and_call_markup_never_reach_text():
    parser = OutputParser([], in_reasoning=False)
    events = []
    for piece in ["Ok", ".\n", "<", "tool", "_call>", '\n{"name": "a", ', '"arguments": {}}', "\n</tool", "_call>", "\nBye"]:
        events += parser.feed(piece)
    events += parser.finish()
    assert events == [TextDelta("Ok"), TextDelta("."), ToolCallEvent(0, "a", "{}"), TextDelta("Bye")]


def test_tool_call_is_emitted_as_soon_as_it_closes():
    parser = OutputParser([], in_reasoning=False)
    assert parser.feed('<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call') == []
    assert parser.feed(">") == [ToolCallEvent(0, "a", "{}")]
    xml = OutputParser([], in_reasoning=False)
    assert xml.feed("<tool_call>\n<function=f>\n<parameter=p>\nv\n</parameter>\n</function>\n") == []
    assert xml.feed("</tool_call>") == [ToolCallEvent(0, "f", '{"p": "v"}')]


def test_bare_xml_call_is_emitted_at_its_function_close():
    parser = OutputParser([], in_reasoning=False)
    assert parser.feed("<function=f>\n<parameter=p>\nv\n</parameter>\n</function") == []
    assert parser.feed(">") == [ToolCallEvent(0, "f", '{"p": "v"}')]


REPRESENTATIVE = [
    "<think>\nplan: a < b\n</think>\n\nAnswer with <b>html</b> and x<y.\n"
    '<tool_call>\n{"name": "write", "arguments": {"content": "</tool_call> \\"q\\" \\\\"}}\n</tool_call>\n',
    "reasoning only</think>\n\nSure.\n\n<tool_call>\n<function=write>\n<parameter=content>\n"
    "a </parameter> b </function> c\n</parameter>\n<parameter=count>\n3\n</parameter>\n</function>\n</tool_call>",
    "Plain answer\n\n\nwith newlines\n\n",
    "<function=write>\n<parameter=path>\nx\n</parameter>\n</function>\n</tool_call>\nAfter <too",
]


@pytest.mark.parametrize("text", REPRESENTATIVE)
@pytest.mark.parametrize("in_reasoning", [False, True])
@pytest.mark.parametrize("parse_tools", [True, False])
def test_same_events_for_every_chunking(parse, text, in_reasoning, parse_tools):
    events = parse(text, in_reasoning=in_reasoning, parse_tools=parse_tools)
    assert events


def test_same_events_when_fed_token_by_token(tiny_tokenizer_pieces, run):
    text = REPRESENTATIVE[0] + REPRESENTATIVE[1]
    pieces = tiny_tokenizer_pieces(text)
    assert "".join(pieces) == text and len(pieces) > 40
    assert coalesce(run(text, pieces)) == coalesce(run(text))


FRAGMENTS = [
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<function=", "<function=f>", "</function>",
    "<parameter=", "<parameter=a>", "</parameter>", "\n", "\n\n", "{", "}", '"', "\\", "<", ">", "x", " ",
    '{"name": "f", "arguments": {"a": 1}}', "<too", "</", '"</tool_call>"', "=",
]


def test_random_markup_soup_never_raises_and_is_chunking_independent(run):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"properties": {"a": {"type": "integer"}}}}}]
    for seed in range(300):
        rng = random.Random(seed)
        text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 25)))
        kwargs = {"tools": tools, "in_reasoning": rng.random() < 0.3, "parse_tools": rng.random() < 0.85}
        whole = coalesce(run(text, **dict(kwargs)))
        pieces, i = [], 0
        while i < len(text):
            pieces.append(text[i : i + rng.randint(1, 6)])
            i += len(pieces[-1])
        assert coalesce(run(text, pieces, **dict(kwargs))) == whole, (seed, text)
        assert coalesce(run(text, list(text), **dict(kwargs))) == whole, (seed, text)
        assert all(e.text for e in whole if isinstance(e, (TextDelta, ReasoningDelta)))


_AMBIGUOUS = re.compile(r"</parameter>\s*(<parameter=|</function>)")
_VALUE_BITS = ["</parameter>", "</function>", "<parameter=x>", "</tool_call>", "<tool_call>", "\n", "\n\n", " ",
               "a", "<", ">", "{", '"', "\\", "</think>", "<function=g>", "}"]


def test_generated_calls_round_trip_exactly(run):
    """Outputs written in the model's format (random tricky values) parse back to what was written."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "properties": {"s": {"type": "string"}, "t": {"type": "string"}, "n": {"type": "integer"}}}}}]
    for seed in range(300):
        rng = random.Random(seed)
        xml = rng.random() < 0.5
        calls = []
        for _ in range(rng.randint(0, 3)):
            args = {}
            for key in rng.sample(["s", "t", "n"], rng.randint(0, 3)):
                value = "".join(rng.choice(_VALUE_BITS) for _ in range(rng.randint(0, 12)))
                args[key] = rng.randint(-5, 500) if key == "n" else ("plain" if _AMBIGUOUS.search(value) else value)
            calls.append(args)
        reasoning, content = rng.choice(["", "why", "a\nb"]), rng.choice(["", "Sure.", "a < b", "x\n\ny"])
        text = f"<think>\n{reasoning}\n</think>\n\n{content}" if reasoning or seed % 2 else content
        for i, args in enumerate(calls):
            text += "\n" if i else ("\n\n" if xml else "\n") if content else ""
            if xml:
                params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
                text += f"<tool_call>\n<function=f>\n{params}</function>\n</tool_call>"
            else:
                text += "<tool_call>\n" + json.dumps({"name": "f", "arguments": args}) + "\n</tool_call>"
        expected = ([ReasoningDelta(reasoning)] if reasoning else []) + ([TextDelta(content)] if content else [])
        expected += [ToolCallEvent(i, "f", json.dumps(a, ensure_ascii=False)) for i, a in enumerate(calls)]
        pieces, i = [], 0
        while i < len(text):
            pieces.append(text[i : i + rng.randint(1, 5)])
            i += len(pieces[-1])
        assert coalesce(run(text, tools=tools)) == expected, (seed, text)
        assert coalesce(run(text, pieces, tools=tools)) == expected, (seed, text)
