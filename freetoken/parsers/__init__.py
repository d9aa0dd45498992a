"""Streaming-safe output parsers: reasoning blocks and tool calls (think-tag / tool-call-tag
formats in :mod:`~freetoken.parsers.output`, gpt-oss's harmony in
:mod:`~freetoken.parsers.harmony`)."""

from freetoken.parsers.events import ParserEvent, ReasoningDelta, TextDelta, ToolCallEvent, coalesce
from freetoken.parsers.harmony import HarmonyParser, opens_harmony_reply, parse_harmony
from freetoken.parsers.output import OutputParser, parse_output, prompt_opens_reasoning

__all__ = [
    "HarmonyParser",
    "OutputParser",
    "ParserEvent",
    "ReasoningDelta",
    "TextDelta",
    "ToolCallEvent",
    "coalesce",
    "opens_harmony_reply",
    "parse_harmony",
    "parse_output",
    "prompt_opens_reasoning",
]
