"""Events an output parser emits while model text streams in."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TextDelta:
    """Visible answer text."""

    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    """Reasoning: text inside a ``<think>…</think>`` block (tags excluded), or a harmony
    ``analysis`` message's content."""

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


def coalesce(events: list[ParserEvent]) -> list[ParserEvent]:
    """Merge adjacent TextDelta (and adjacent ReasoningDelta) events into one.

    A parser's event stream depends on how the text was chunked only in how deltas are split;
    coalesced streams are equal whatever the chunking.
    """
    out: list[ParserEvent] = []
    for event in events:
        last = out[-1] if out else None
        if isinstance(event, TextDelta) and isinstance(last, TextDelta):
            out[-1] = TextDelta(last.text + event.text)
        elif isinstance(event, ReasoningDelta) and isinstance(last, ReasoningDelta):
            out[-1] = ReasoningDelta(last.text + event.text)
        else:
            out.append(event)
    return out
