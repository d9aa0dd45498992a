"""Tool calls in the Qwen3 JSON form and the XML form, typed by the tool schema."""

from __future__ import annotations

import json

from freetoken.parsers import ReasoningDelta as R
from freetoken.parsers import TextDelta as T
from freetoken.parsers import ToolCallEvent as Call


def test_json_form_with_text_and_reasoning(parse):
    text = (
        "<think>\nNeed ls.\n</think>\n\nListing.\n<tool_call>\n"
        '{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>'
    )
    assert parse(text) == [R("Need ls."), T("Listing."), Call(0, "bash", '{"command": "ls -la"}')]


def test_json_form_several_calls(parse):
    text = (
        '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments": {"x": [1, 2.5, null, true]}}\n</tool_call>'
    )
    assert parse(text) == [Call(0, "a", "{}"), Call(1, "b", '{"x": [1, 2.5, null, true]}')]


def test_json_strings_may_contain_the_closing_tag_and_escapes(parse):
    args = {"command": 'echo "</tool_call>" \\ done', "note": "ünï <b>"}
    text = "<tool_call>\n" + json.dumps({"name": "bash", "arguments": args}, ensure_ascii=True) + "\n</tool_call>"
    assert parse(text) == [Call(0, "bash", json.dumps(args, ensure_ascii=False))]


def test_json_arguments_as_string_and_parameters_alias(parse):
    text = (
        '<tool_call>{"name": "a", "arguments": "{\\"k\\": 1}"}</tool_call>'
        '<tool_call>{"name": "b", "parameters": {"k": 2}}</tool_call>'
        '<tool_call>{"name": "c"}</tool_call>'
    )
    assert parse(text) == [Call(0, "a", '{"k": 1}'), Call(1, "b", '{"k": 2}'), Call(2, "c", "{}")]


def test_json_form_literal_newline_inside_string_is_accepted(parse):
    text = '<tool_call>\n{"name": "write", "arguments": {"content": "line1\nline2"}}\n</tool_call>'
    assert parse(text) == [Call(0, "write", '{"content": "line1\\nline2"}')]


def test_text_between_and_after_calls(parse):
    text = 'A\n<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\nB\n\n<tool_call>{"name": "b"}</tool_call>\n\nC'
    assert parse(text) == [T("A"), Call(0, "a", "{}"), T("B"), Call(1, "b", "{}"), T("C")]


def test_xml_form_typed_by_schema(parse):
    text = (
        "Writing.\n\n<tool_call>\n<function=write>\n"
        "<parameter=zip>\n03106\n</parameter>\n"
        "<parameter=count>\n 42 \n</parameter>\n"
        "<parameter=ratio>\n0.5\n</parameter>\n"
        "<parameter=force>\nTrue\n</parameter>\n"
        '<parameter=meta>\n{"a": {"b": [1]}}\n</parameter>\n'
        '<parameter=tags>\n["x", "y"]\n</parameter>\n'
        "<parameter=mode>\nnull\n</parameter>\n"
        "<parameter=anything>\n[1, 2]\n</parameter>\n"
        "<parameter=undeclared>\n7\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    expected = {
        "zip": "03106", "count": 42, "ratio": 0.5, "force": True, "meta": {"a": {"b": [1]}},
        "tags": ["x", "y"], "mode": None, "anything": [1, 2], "undeclared": "7",
    }
    assert parse(text) == [T("Writing."), Call(0, "write", json.dumps(expected))]


def test_xml_values_that_do_not_fit_the_schema_stay_strings(parse):
    text = (
        "<tool_call>\n<function=write>\n<parameter=count>\nmany\n</parameter>\n"
        "<parameter=force>\nyes\n</parameter>\n<parameter=meta>\n[1]\n</parameter>\n"
        "<parameter=ratio>\nNaN\n</parameter>\n</function>\n</tool_call>"
    )
    expected = {"count": "many", "force": "yes", "meta": "[1]", "ratio": "NaN"}
    assert parse(text) == [Call(0, "write", json.dumps(expected))]


def test_xml_code_values_come_back_byte_exact(parse):
    code = (
        "\nfunction f(a, b) {\n  if (a < b && b > 0) return '</function>';\n"
        '  const s = "</parameter>";\n  return `<parameter=x>`;\n}\n'
        '{"looks": "like json"}\n\n'
    )
    values = {"path": "src/<weird>.js", "content": code, "zip": '{"a": 1}', "anything": "  spaced  "}
    text = "<tool_call>\n<function=write>\n"
    for name, value in values.items():
        text += f"<parameter={name}>\n{value}\n</parameter>\n"
    text += "</function>\n</tool_call>"
    events = parse(text)
    assert len(events) == 1 and isinstance(events[0], Call)
    assert json.loads(events[0].arguments) == values


def test_xml_without_tool_call_wrapper(parse):
    text = "Doing it.\n<function=write>\n<parameter=path>\na.txt\n</parameter>\n</function>\nDone?"
    assert parse(text) == [T("Doing it."), Call(0, "write", '{"path": "a.txt"}'), T("Done?")]


def test_xml_value_without_framing_newlines_and_calls_without_parameters(parse):
    text = (
        "<tool_call><function=write><parameter=path>a.txt</parameter></function></tool_call>"
        "<tool_call>\n<function=noargs>\n</function>\n</tool_call>"
    )
    assert parse(text) == [Call(0, "write", '{"path": "a.txt"}'), Call(1, "noargs", "{}")]


def test_unknown_tool_name_is_still_a_call_with_string_values(parse):
    text = "<tool_call>\n<function=mystery>\n<parameter=n>\n5\n</parameter>\n</function>\n</tool_call>"
    assert parse(text) == [Call(0, "mystery", '{"n": "5"}')]


def test_json_and_xml_forms_in_one_answer(parse):
    text = (
        '<tool_call>\n{"name": "a", "arguments": {"k": "v"}}\n</tool_call>\n'
        "<tool_call>\n<function=write>\n<parameter=count>\n3\n</parameter>\n</function>\n</tool_call>"
    )
    assert parse(text) == [Call(0, "a", '{"k": "v"}'), Call(1, "write", '{"count": 3}')]


def test_tools_markup_is_plain_text_when_tool_parsing_is_off(parse):
    text = '<think>\nr\n</think>\n\nA\n<tool_call>\n{"name": "a"}\n</tool_call>\n<function=x>'
    assert parse(text, parse_tools=False) == [R("r"), T('A\n<tool_call>\n{"name": "a"}\n</tool_call>\n<function=x>')]


def test_anthropic_style_tool_definitions_type_values(parse):
    tools = [{"name": "grep", "input_schema": {"type": "object", "properties": {"limit": {"type": "integer"}}}}]
    text = "<tool_call>\n<function=grep>\n<parameter=limit>\n10\n</parameter>\n</function>\n</tool_call>"
    assert parse(text, tools=tools) == [Call(0, "grep", '{"limit": 10}')]
