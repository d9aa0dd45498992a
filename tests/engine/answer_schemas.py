"""Answer schemas for the structured-output tests, bounded like the tool schemas
(:mod:`tests.engine.constrained_schemas`) so a randomly weighted walk ends within a few dozen
tokens, and a checker that parses an answer and validates it."""

from __future__ import annotations

import json

from tests.engine.constrained_schemas import violations

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"type": "string", "enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["x", "y"]},
                 "maxItems": 3},
    },
    "required": ["name", "age", "role", "tags"],
}
NESTED = {
    "type": "object",
    "$defs": {"kind": {"type": "string", "enum": ["a", "b"]}},
    "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 999},
        "owner": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 6},
                           "active": {"type": "boolean"}},
            "required": ["name", "active"],
        },
        "kind": {"$ref": "#/$defs/kind"},
        "note": {"type": "string", "enum": ["ok"]},
    },
    "required": ["id", "owner", "kind"],
}
SCHEMAS = {"person": PERSON, "nested": NESTED}


def check_answer(text: str, schema: dict) -> object:
    """Parse ``text`` as JSON and assert it satisfies ``schema`` (undeclared keys refused)."""
    value = json.loads(text)
    problems = violations(value, schema)
    assert problems == [], (text, problems)
    return value
