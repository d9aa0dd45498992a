"""Numbers in tool-call arguments that do not fit a double (``1e999``) would be re-serialised as
``Infinity`` (not JSON; a 500 in the Anthropic JSON response): such a call is returned as text."""

from __future__ import annotations

import json

import pytest

from freetoken.parsers import OutputParser
from freetoken.parsers.events import TextDelta, ToolCallEvent

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "object"}}}}}]


def _events(text: str) -> list:
    parser = OutputParser(TOOLS, in_reasoning=False)
    return list(parser.feed(text)) + list(parser.finish())


@pytest.mark.parametrize("args", ['{"x": 1e999}', '{"x": -1e400}', '{"y": {"z": [1, 2e308]}}'])
def test_overflowing_numbers_are_text(args: str) -> None:
    text = f'<tool_call>\n{{"name": "f", "arguments": {args}}}\n</tool_call>'
    events = _events(text)
    assert events == [TextDelta(text)]


def test_large_finite_numbers_stay_calls() -> None:
    events = _events('<tool_call>\n{"name": "f", "arguments": {"x": 1.5e300, "y": {"z": -2e-300}}}\n</tool_call>')
    assert len(events) == 1 and isinstance(events[0], ToolCallEvent)
    assert json.loads(events[0].arguments) == {"x": 1.5e300, "y": {"z": -2e-300}}
