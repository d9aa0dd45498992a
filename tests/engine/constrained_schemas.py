"""Tool schemas for the constrained-decoding tests, and a small JSON-schema checker for them.

The schemas are bounded (enums, integer ranges, patterns, maxLength, maxItems), so every string
the grammar allows is short and a randomly weighted walk through it ends within a few dozen
tokens. :func:`violations` implements the subset of JSON Schema (draft 2020-12) they use.
"""

from __future__ import annotations

import json
import re

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Oslo", "Nice"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "unit": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city"],
        },
    },
}
ZIP = {
    "type": "function",
    "function": {
        "name": "set_zip",
        "parameters": {
            "type": "object",
            "properties": {
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                "note": {"type": "string", "maxLength": 6},
            },
            "required": ["zip"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {
            "type": "object",
            "$defs": {"mode": {"type": "string", "enum": ["fast", "deep"]}},
            "properties": {
                "filter": {
                    "type": "object",
                    "properties": {
                        "tags": {
                            "type": "array",
                            "items": {"type": "string", "enum": ["a", "b"]},
                            "maxItems": 2,
                        },
                        "limit": {"type": "integer", "minimum": -3, "maximum": 20},
                        "exact": {"type": "boolean"},
                    },
                    "required": ["limit"],
                },
                "mode": {"$ref": "#/$defs/mode"},
            },
            "required": ["filter", "mode"],
        },
    },
}
TOOLS = [WEATHER, ZIP, SEARCH]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def violations(value, schema: dict, root: dict | None = None, path: str = "$") -> list[str]:
    """Every way ``value`` breaks ``schema`` (empty when valid). Undeclared object keys are
    violations when the schema lists ``properties`` (the grammar's strict mode)."""
    root = root if root is not None else schema
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return violations(value, root["$defs"][name], root, path)
    out: list[str] = []
    kind = schema.get("type")
    if kind is not None and not _TYPES[kind](value):
        return [f"{path}: {value!r} is not {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{path}: {value!r} not in {schema['enum']}")
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            out.append(f"{path}: {value!r} does not match {schema['pattern']}")
        if len(value) > schema.get("maxLength", len(value)):
            out.append(f"{path}: {value!r} longer than {schema['maxLength']}")
    if isinstance(value, int) and not isinstance(value, bool):
        if not schema.get("minimum", value) <= value <= schema.get("maximum", value):
            out.append(f"{path}: {value} out of range")
    if isinstance(value, list):
        if len(value) > schema.get("maxItems", len(value)):
            out.append(f"{path}: more than {schema['maxItems']} items")
        for i, item in enumerate(value):
            out += violations(item, schema.get("items", {}), root, f"{path}[{i}]")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        out += [f"{path}: missing {k!r}" for k in schema.get("required", []) if k not in value]
        for key, item in value.items():
            if key in props:
                out += violations(item, props[key], root, f"{path}.{key}")
            elif "properties" in schema:
                out.append(f"{path}: undeclared {key!r}")
    return out


def check_call(name: str, arguments: str, allowed: set[str] | None = None) -> dict:
    """Decode a reported call's arguments and assert they satisfy its tool's schema."""
    assert name in (allowed or SCHEMAS), name
    args = json.loads(arguments)
    problems = violations(args, SCHEMAS[name])
    assert problems == [], (name, args, problems)
    return args
