"""XML parameter typing by JSON schema (freetoken.parsers.schema)."""

from __future__ import annotations

import pytest

from freetoken.parsers.schema import coerce_parameter, tool_parameter_schemas


@pytest.mark.parametrize(
    "raw, schema, value",
    [
        ("03106", {"type": "string"}, "03106"),
        (" 42 ", {"type": "string"}, " 42 "),
        ("42", {"type": "integer"}, 42),
        ("-7", {"type": "integer"}, -7),
        ("5.0", {"type": "integer"}, "5.0"),
        ("1e3", {"type": "number"}, 1000.0),
        ("3", {"type": "number"}, 3),
        ("Infinity", {"type": "number"}, "Infinity"),
        ("1e999", {"type": "number"}, "1e999"),
        ("FALSE", {"type": "boolean"}, False),
        ("null", {"type": "null"}, None),
        ("null", {"type": ["integer", "null"]}, None),
        ("12", {"type": ["integer", "null"]}, 12),
        ("12", {"anyOf": [{"type": "integer"}, {"type": "string"}]}, "12"),
        ("12", {"oneOf": [{"type": "integer"}, {"type": "boolean"}]}, 12),
        ("fast", {"enum": ["fast", "slow"]}, "fast"),
        ('{"a": 1}', {"properties": {"a": {}}}, {"a": 1}),
        ("[1]", {"items": {}}, [1]),
        ('"quoted"', {}, '"quoted"'),
        ("true", {}, True),
        ("hello", {}, "hello"),
        ("{bad", {"type": "object"}, "{bad"),
        ("7", None, "7"),
    ],
)
def test_coerce_parameter(raw, schema, value):
    got = coerce_parameter(raw, schema)
    assert got == value and type(got) is type(value)


def test_tool_parameter_schemas_accepts_openai_bare_and_anthropic_forms():
    tools = [
        {"type": "function", "function": {"name": "a", "parameters": {"properties": {"x": {"type": "integer"}}}}},
        {"name": "b", "parameters": {"type": "object"}},
        {"name": "c", "input_schema": {"properties": {"y": {"type": "string"}, "bad": 3}}},
        {"function": {"description": "no name"}},
        "not a tool",
    ]
    assert tool_parameter_schemas(tools) == {
        "a": {"x": {"type": "integer"}},
        "b": {},
        "c": {"y": {"type": "string"}},
    }
    assert tool_parameter_schemas(None) == {}
