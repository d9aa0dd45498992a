"""Streaming-safe output parsers: reasoning blocks and tool calls."""

from freetoken.parsers.events import ParserEvent, ReasoningDelta, TextDelta, ToolCallEvent, coalesce
from freetoken.parsers.output import OutputParser, parse_output, prompt_opens_reasoning

__all__ = [
    "OutputParser",
    "ParserEvent",
    "ReasoningDelta",
    "TextDelta",
    "ToolCallEvent",
    "coalesce",
    "parse_output",
    "prompt_opens_reasoning",
]
