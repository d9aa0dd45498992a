"""Events an output parser emits while model text streams in."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TextDelta:
    """Visible answer text."""

    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    """Text inside a ``<think>…</think>`` block (tags excluded)."""

    text: str


@dataclass(frozen=True)
class ToolCallEvent:
    """One complete tool call.

    Attributes:
        index: 0-based position among this response's tool calls.
        name: function name.
        arguments: the arguments as a JSON object text (``json.dumps`` of a dict, types
            following the tool's JSON schema; byte-exact string values).
    """

    index: int
    name: str
    arguments: str


ParserEvent = TextDelta | ReasoningDelta | ToolCallEvent
