"""Streaming parser that splits model output into answer text, reasoning and tool calls.

Written for the Qwen3 family and GLM-4.5+ output formats (model-architectures.md §7.3-7.4,
harnesses.md §8 and "GLM-4.5 / 4.6"):

* ``<think>…</think>`` is reasoning. The think block may already be open in the prompt (the
  generation prompt ended with ``<think>\\n``: pass ``in_reasoning=True``, see
  :func:`prompt_opens_reasoning`); a ``<think>`` written by the model (at the start, or later
  for interleaved thinking; GLM writes ``\\n<think>``) opens one. The template's
  newline conventions are removed: newlines right after ``<think>`` and right before ``</think>``,
  newlines after ``</think>`` or after a tool call, and newlines at the very start of the output
  (GLM writes one after a ``<think></think>`` the prompt pre-filled).
* Tool calls (JSON, XML or GLM form, :mod:`freetoken.parsers.toolcall`) become
  :class:`ToolCallEvent`; newlines between the answer text and a call are removed.
* Everything else is :class:`TextDelta`.

Streaming rule: text is released as soon as it cannot be the start of a tag. Only a suffix that
could still become a tag (``"<too"``), plus in answer text the newlines right before it (they are
dropped if a tool call or think block follows), is held back; a tool call is emitted once
complete (at its closing tag). Coalesced events
(:func:`coalesce`) do not depend on how the output was chunked.

Malformed markup never raises: a call that cannot be parsed is returned as plain text with its
tags; a lone surrogate escape (``"\\ud83d"``) in a call's JSON becomes U+FFFD; stray
``</think>`` and ``</tool_call>`` tags are dropped. With ``parse_tools=False`` tool
markup is ordinary text. At :meth:`OutputParser.finish`, a cut-off tag prefix of two characters
or more at the very end (``"</"``, ``"<tool_"``) is dropped; a call that is complete except for
its closing tags is still parsed, and one cut off earlier by the token limit
(``finish(truncated=True)``) is dropped.

The engine is expected to stop on ``<|im_end|>`` / ``<|endoftext|>`` (GLM: ``<|user|>`` /
``<|observation|>`` / ``<|endoftext|>``) and not feed them.
"""

from __future__ import annotations

import json
import re

from freetoken.parsers.events import ParserEvent, ReasoningDelta, TextDelta, ToolCallEvent, coalesce
from freetoken.parsers.schema import tool_parameter_schemas
from freetoken.parsers.toolcall import FUNC_OPEN, TOOL_CLOSE, TOOL_OPEN, CallScanner, scrub_surrogates
from freetoken.parsers.stream import StreamParser

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
_TEXT, _REASONING, _CALL = "text", "reasoning", "call"


def _partial_len(buf: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of one of ``tags``."""
    for k in range(min(len(buf), max(len(t) for t in tags) - 1), 0, -1):
        tail = buf[-k:]
        if any(len(t) > k and t.startswith(tail) for t in tags):
            return k
    return 0


def prompt_opens_reasoning(prompt: str) -> bool:
    """True when the rendered prompt leaves a think block open for the model to continue.

    That is the case when the last ``<think>`` of the last turn (after the last ``<|im_start|>``
    or GLM ``<|assistant|>``) has no ``</think>`` after it (Qwen3-Next / Qwen3.5 generation
    prompts end with ``<think>\\n``; with ``enable_thinking=False`` they end with
    ``<think>\\n\\n</think>\\n\\n``; GLM-4.5 / 4.6 ones end with ``<|assistant|>`` or
    ``<|assistant|>\\n<think></think>``).
    """
    # Only the last turn counts: a user message may quote "<think>" without closing it.
    start = max(prompt.rfind("<|im_start|>"), prompt.rfind("<|assistant|>"), 0)
    turn = prompt[start:]
    opened = turn.rfind(THINK_OPEN)
    return opened >= 0 and turn.find(THINK_CLOSE, opened) < 0


class OutputParser(StreamParser):
    """Incremental parser of one generated answer (rules in the module docstring).

    Args:
        tools: the request's tool definitions (used to type XML parameter values), or None.
        in_reasoning: the prompt already opened the think block.
        parse_tools: recognise tool-call markup; False when the request has no tools or
            ``tool_choice`` is ``"none"``.
    """

    def __init__(self, tools: list[dict] | None, *, in_reasoning: bool, parse_tools: bool = True) -> None:
        self._schemas = tool_parameter_schemas(tools) if parse_tools else {}
        tags = (THINK_OPEN, THINK_CLOSE) + ((TOOL_OPEN, TOOL_CLOSE, FUNC_OPEN) if parse_tools else ())
        self._tags = tags
        self._tag_re = re.compile("|".join(re.escape(t) for t in tags))
        super().__init__()
        self._mode = _REASONING if in_reasoning else _TEXT
        self._fresh = in_reasoning  # at the start of a think block: drop newlines and a repeated <think>
        # drop newlines (at the start of the output, after </think> or after a tool call)
        self._strip_nl = True
        self._held_nl = ""  # newlines removed before a call opener, given back if the call is malformed
        self._opener = ""
        self._scanner: CallScanner | None = None

    def _drain(self, final: bool) -> list[ParserEvent]:
        out: list[ParserEvent] = []
        step = {_TEXT: self._text_step, _REASONING: self._reasoning_step, _CALL: self._call_step}
        while step[self._mode](final, out):
            pass
        return out

    def _text_step(self, final: bool, out: list[ParserEvent]) -> bool:
        if self._strip_nl:
            self._buf = self._buf.lstrip("\n")
            if not self._buf:
                return False
            self._strip_nl = False
        m = self._tag_re.search(self._buf)
        if m is None:
            buf = self._buf
            k = _partial_len(buf, self._tags)
            if final:
                text, self._buf = (buf[:-k] if k >= 2 else buf), ""
            else:
                # newlines right before a tool call or a think block are dropped: wait for what follows
                end = len(buf[: len(buf) - k].rstrip("\n"))
                text, self._buf = buf[:end], buf[end:]
            if text:
                out.append(TextDelta(text))
            return False
        before, tag = self._buf[: m.start()], m.group()
        if tag in (TOOL_OPEN, FUNC_OPEN, THINK_OPEN):
            trimmed = before.rstrip("\n")
            self._held_nl, before = before[len(trimmed) :], trimmed
        if before:
            out.append(TextDelta(before))
        if tag == THINK_OPEN:
            self._mode, self._fresh, self._buf = _REASONING, True, self._buf[m.end() :]
        elif tag in (THINK_CLOSE, TOOL_CLOSE):  # stray closing tag: dropped
            self._buf, self._strip_nl = self._buf[m.end() :], True
        else:
            wrapped = tag == TOOL_OPEN
            self._mode, self._opener = _CALL, tag if wrapped else ""
            self._scanner = CallScanner(self._schemas, wrapped=wrapped)
            self._buf = self._buf[m.end() :] if wrapped else self._buf[m.start() :]
        return True

    def _reasoning_step(self, final: bool, out: list[ParserEvent]) -> bool:
        if self._fresh:
            buf = self._buf.lstrip("\n")
            if buf.startswith(THINK_OPEN):
                self._buf = buf[len(THINK_OPEN) :]
                return True
            self._buf = buf
            if not buf or (not final and THINK_OPEN.startswith(buf)):
                return False
            self._fresh = False
        end = self._buf.find(THINK_CLOSE)
        if end >= 0:
            text = self._buf[:end].rstrip("\n")
            if text:
                out.append(ReasoningDelta(text))
            self._buf, self._mode, self._strip_nl = self._buf[end + len(THINK_CLOSE) :], _TEXT, True
            return True
        buf = self._buf
        k = _partial_len(buf, (THINK_CLOSE,))
        if final:
            text, self._buf = (buf[:-k] if k >= 2 else buf).rstrip("\n"), ""
        else:
            cut = len(buf[: len(buf) - k].rstrip("\n"))
            text, self._buf = buf[:cut], buf[cut:]
        if text:
            out.append(ReasoningDelta(text))
        return False

    def _call_step(self, final: bool, out: list[ParserEvent]) -> bool:
        step = self._scanner.advance(self._buf, final)
        if step is None:
            if not final:
                return False
            step_consumed, call = len(self._buf), None
        else:
            step_consumed, call = step.consumed, step.call
        raw, self._buf = self._buf[:step_consumed], self._buf[step_consumed:]
        if call is not None:
            arguments = json.dumps(scrub_surrogates(call.arguments), ensure_ascii=False)
            out.append(ToolCallEvent(self._calls, scrub_surrogates(call.name), arguments))
            self._calls += 1
            self._strip_nl = True
        elif not (final and self._truncated):  # a call cut off by the token limit: dropped
            out.append(TextDelta(self._held_nl + self._opener + raw))
        self._held_nl, self._opener, self._scanner, self._mode = "", "", None, _TEXT
        return True


def parse_output(
    text: str, tools: list[dict] | None, *, in_reasoning: bool, parse_tools: bool = True
) -> list[ParserEvent]:
    """Parse a complete (non-streamed) output; adjacent deltas are coalesced.

    Same rules as :class:`OutputParser`.
    """
    parser = OutputParser(tools, in_reasoning=in_reasoning, parse_tools=parse_tools)
    return coalesce(parser.feed(text) + parser.finish())
