"""Tool calls in the GLM form (<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>…
</tool_call>) and GLM reasoning framing, checked whole and across chunkings."""

from __future__ import annotations

import json
import random
import re

import pytest

from freetoken.chat.template import ChatTemplate
from freetoken.parsers import OutputParser, coalesce, prompt_opens_reasoning
from freetoken.parsers import ReasoningDelta as R
from freetoken.parsers import TextDelta as T
from freetoken.parsers import ToolCallEvent as Call

GOOD = "<tool_call>ok\n</tool_call>"


def glm_call(name: str, args: dict) -> str:
    """A call written the way templates/glm4_moe.jinja renders it."""
    pairs = "".join(
        f"<arg_key>{k}</arg_key>\n<arg_value>{v if isinstance(v, str) else json.dumps(v)}"
        "</arg_value>\n"
        for k, v in args.items()
    )
    return f"<tool_call>{name}\n{pairs}</tool_call>"


def test_reasoning_text_and_call(parse):
    text = (
        "\n<think>Need ls.</think>\nListing.\n<tool_call>write\n<arg_key>path</arg_key>\n"
        "<arg_value>a.txt</arg_value>\n<arg_key>count</arg_key>\n<arg_value>3</arg_value>\n"
        "</tool_call>"
    )
    assert parse(text) == [R("Need ls."), T("Listing."),
                           Call(0, "write", '{"path": "a.txt", "count": 3}')]


def test_same_events_when_fed_token_by_token(tiny_tokenizer_pieces, run):
    text = (
        "\n<think>plan: a < b</think>\nSure.\n"
        + glm_call("write", {"content": "x </arg_value> y", "count": 2})
        + "\n" + glm_call("noargs", {})
    )
    pieces = tiny_tokenizer_pieces(text)
    assert "".join(pieces) == text and len(pieces) > 30
    expected = [R("plan: a < b"), T("Sure."),
                Call(0, "write", '{"content": "x </arg_value> y", "count": 2}'),
                Call(1, "noargs", "{}")]
    assert coalesce(run(text, pieces)) == expected
    assert coalesce(run(text)) == expected


def test_values_typed_by_schema(parse):
    args = {
        "zip": "03106", "count": " 42 ", "ratio": "0.5", "force": "True",
        "meta": '{"a": {"b": [1]}}', "tags": '["x", "y"]', "mode": "null",
        "anything": "[1, 2]", "undeclared": "7",
    }
    expected = {
        "zip": "03106", "count": 42, "ratio": 0.5, "force": True, "meta": {"a": {"b": [1]}},
        "tags": ["x", "y"], "mode": None, "anything": [1, 2], "undeclared": "7",
    }
    assert parse(glm_call("write", args)) == [Call(0, "write", json.dumps(expected))]


def test_values_that_do_not_fit_the_schema_stay_strings(parse):
    args = {"count": "many", "force": "yes", "meta": "[1]", "ratio": "NaN"}
    assert parse(glm_call("write", args)) == [Call(0, "write", json.dumps(args))]


def test_code_values_come_back_byte_exact(parse):
    code = (
        "\nfunction f(a, b) {\n  if (a < b) return '</tool_call>';\n"
        '  const s = "</arg_value>";\n  return `<arg_key>x</arg_key>`;\n}\n\n'
    )
    values = {"path": "src/<weird>.js", "content": code, "zip": '{"a": 1}', "anything": "  sp  "}
    events = parse(glm_call("write", values))
    assert len(events) == 1 and isinstance(events[0], Call)
    assert json.loads(events[0].arguments) == values


def test_several_calls_with_text_between_and_compact_spacing(parse):
    text = (
        "A\n" + glm_call("write", {"path": "a"}) + "\nB\n\n"
        "<tool_call>write<arg_key>path</arg_key><arg_value>b</arg_value></tool_call>"
        "<tool_call>\nwrite\n\n<arg_key> path </arg_key>\n\n<arg_value>c</arg_value>\n\n"
        "</tool_call>"
        "\n\nC"
    )
    assert parse(text) == [
        T("A"), Call(0, "write", '{"path": "a"}'), T("B"), Call(1, "write", '{"path": "b"}'),
        Call(2, "write", '{"path": "c"}'), T("C"),
    ]


def test_calls_without_arguments(parse):
    text = "<tool_call>noargs</tool_call><tool_call>mcp.srv:get-time\n</tool_call>"
    assert parse(text) == [Call(0, "noargs", "{}"), Call(1, "mcp.srv:get-time", "{}")]


def test_unknown_tool_and_repeated_key(parse):
    text = glm_call("mystery", {"n": "5"}).replace(
        "</tool_call>", "<arg_key>n</arg_key>\n<arg_value>6</arg_value>\n</tool_call>")
    assert parse(text) == [Call(0, "mystery", '{"n": "6"}')]


def test_all_three_forms_in_one_answer(parse):
    text = (
        '<tool_call>\n{"name": "a", "arguments": {"k": "v"}}\n</tool_call>\n'
        "<tool_call>\n<function=write>\n<parameter=count>\n3\n</parameter>\n</function>\n"
        "</tool_call>\n" + glm_call("write", {"count": "4"})
    )
    assert parse(text) == [Call(0, "a", '{"k": "v"}'), Call(1, "write", '{"count": 3}'),
                           Call(2, "write", '{"count": 4}')]


@pytest.mark.parametrize(
    "bad",
    [
        "<tool_call>bash(command='ls')</tool_call>",
        "<tool_call>just words</tool_call>",
        "<tool_call>!!\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n</tool_call>",
        "<tool_call>" + "n" * 257 + "</tool_call>",
        "<tool_call>f\n<arg_key>a</arg_key>\n</tool_call>",
        "<tool_call>f\n<arg_key>a</arg_key>\n<arg_key>b</arg_key>\n<arg_value>1</arg_value>"
        "\n</tool_call>",
        "<tool_call>f\n<arg_key>a\nb</arg_key>\n<arg_value>1</arg_value>\n</tool_call>",
        "<tool_call>f\n<arg_key></arg_key>\n<arg_value>1</arg_value>\n</tool_call>",
        "<tool_call>f\n<arg_value>1</arg_value>\n</tool_call>",
        "<tool_call>f\nstray words\n</tool_call>",
    ],
)
def test_malformed_call_is_text_and_the_next_call_still_parses(parse, bad):
    assert parse("Before.\n" + bad + "\n" + GOOD + "\nAfter.") == [
        T("Before.\n" + bad), Call(0, "ok", "{}"), T("After."),
    ]


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>value never closed",
        "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>v</arg_value> then prose",
        "<tool_call>f\n<arg_key>a</arg_key>",
        "<tool_call>f\n<arg_key>a",
        "<tool_call>cut_off_na",
    ],
)
def test_unterminated_incomplete_calls_are_text_at_finish(parse, text):
    assert parse("Hi\n" + text) == [T("Hi\n" + text)]


def test_unterminated_but_complete_calls_are_parsed_at_finish(parse):
    body = "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>v</arg_value>\n"
    assert parse("Go.\n" + body) == [T("Go."), Call(0, "f", '{"a": "v"}')]
    assert parse(body + "</tool_") == [Call(0, "f", '{"a": "v"}')]
    assert parse("<tool_call>f\n") == [Call(0, "f", "{}")]


def test_call_is_emitted_as_soon_as_it_closes_and_markup_never_reaches_text():
    parser = OutputParser([], in_reasoning=False)
    events = []
    for piece in ["Ok", ".\n", "<tool", "_call>", "f\n<arg", "_key>a</arg_key>\n<arg_value>",
                  "v</arg_value>", "\n</tool_call"]:
        events += parser.feed(piece)
    assert events == [T("Ok"), T(".")]
    assert parser.feed(">") == [Call(0, "f", '{"a": "v"}')]
    assert parser.feed("\nBye") == [T("Bye")]
    assert parser.finish() == []


def test_glm_reasoning_framing(parse):
    assert parse("\n<think>\nHmm.\n</think>\nHi!") == [R("Hmm."), T("Hi!")]
    assert parse("\n\nHi!\n\nBye") == [T("Hi!\n\nBye")]  # after a pre-filled <think></think>
    assert parse("<think></think>\nHi!") == [T("Hi!")]


def test_prompt_opens_reasoning_on_glm_prompts():
    glm = ChatTemplate.for_model(None, "glm4_moe")
    quoting = [{"role": "user", "content": "what does <think> do?"}]
    for thinking in (None, True, False):
        assert prompt_opens_reasoning(glm.render(quoting, enable_thinking=thinking)) is False
    assert prompt_opens_reasoning("[gMASK]<sop><|user|>\nhi<|assistant|>\n<think>") is True
    assert prompt_opens_reasoning("<|user|>\nsay <think><|assistant|>\n<think></think>") is False


FRAGMENTS = [
    "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
    "f", "f\n", "a", "<think>", "</think>", "\n", "\n\n", " ", "<", ">", "x", "(", "<arg_", "</",
    "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n</tool_call>",
]


def test_random_markup_soup_never_raises_and_is_chunking_independent(run):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "properties": {"a": {"type": "integer"}}}}}]
    for seed in range(300):
        rng = random.Random(seed)
        text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 25)))
        kwargs = {"tools": tools, "in_reasoning": rng.random() < 0.3}
        whole = coalesce(run(text, **dict(kwargs)))
        pieces, i = [], 0
        while i < len(text):
            pieces.append(text[i : i + rng.randint(1, 6)])
            i += len(pieces[-1])
        assert coalesce(run(text, pieces, **dict(kwargs))) == whole, (seed, text)
        assert coalesce(run(text, list(text), **dict(kwargs))) == whole, (seed, text)
        assert all(e.text for e in whole if isinstance(e, (T, R)))


_AMBIGUOUS = re.compile(r"</arg_value>\s*(<arg_key>|</tool_call>)")
_VALUE_BITS = ["</arg_value>", "</arg_key>", "<arg_key>", "<arg_value>", "</tool_call>",
               "<tool_call>", "\n", "\n\n", " ", "a", "<", ">", "{", '"', "</think>", "}"]


def test_generated_calls_round_trip_exactly(run):
    """Random tricky values written in the GLM form parse back to what was written."""
    props = {"s": {"type": "string"}, "t": {"type": "string"}, "n": {"type": "integer"}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"properties": props}}}]
    for seed in range(300):
        rng = random.Random(seed)
        calls = []
        for _ in range(rng.randint(0, 3)):
            args = {}
            for key in rng.sample(["s", "t", "n"], rng.randint(0, 3)):
                value = "".join(rng.choice(_VALUE_BITS) for _ in range(rng.randint(0, 12)))
                plain = "plain" if _AMBIGUOUS.search(value) else value
                args[key] = rng.randint(-5, 500) if key == "n" else plain
            calls.append(args)
        reasoning, content = rng.choice(["", "why", "a\nb"]), rng.choice(["", "Sure.", "a < b"])
        text = f"\n<think>{reasoning}</think>" if reasoning or seed % 2 else ""
        text += f"\n{content}" if content else ""
        text += "".join("\n" + glm_call("f", args) for args in calls)
        expected = ([R(reasoning)] if reasoning else []) + ([T(content)] if content else [])
        expected += [Call(i, "f", json.dumps(a, ensure_ascii=False)) for i, a in enumerate(calls)]
        pieces, i = [], 0
        while i < len(text):
            pieces.append(text[i : i + rng.randint(1, 5)])
            i += len(pieces[-1])
        assert coalesce(run(text, tools=tools)) == expected, (seed, text)
        assert coalesce(run(text, pieces, tools=tools)) == expected, (seed, text)


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>f" + "\n" * 3000 + "<arg_key>a</arg_key>" + "\n" * 3000 + "<arg_value>1"
        "</arg_value>" + "\n" * 3000 + "<arg_key>b</arg_key><arg_value>x</arg_value>"
        + " \n" * 1500 + "</tool_call>",
        "<tool_call>\n<function=f>" + "\n" * 3000 + "<parameter=a>\n1\n</parameter>"
        + "\n" * 3000 + "</function>" + "\n" * 3000 + "</tool_call>",
    ],
    ids=["glm", "xml"],
)
def test_whitespace_between_tags_is_scanned_once(monkeypatch, run, text):
    """Fed one character at a time, a call with long whitespace runs between its tags costs
    linear work: the scanners never skip the same whitespace twice."""
    import freetoken.parsers.toolcall as toolcall

    skipped = []
    real_skip_ws = toolcall._skip_ws

    def counting_skip_ws(buf: str, i: int) -> int:
        j = real_skip_ws(buf, i)
        skipped.append(j - i)
        return j

    monkeypatch.setattr(toolcall, "_skip_ws", counting_skip_ws)
    events = coalesce(run(text, list(text), tools=None))
    assert [type(e) for e in events] == [Call]
    assert sum(skipped) < 2 * len(text)
