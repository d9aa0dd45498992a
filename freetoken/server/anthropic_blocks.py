"""Turns parser events into Anthropic content blocks, as stream events and as final blocks.

One state machine serves both modes, so a streamed response and a non-streamed one carry the same
blocks (docs.anthropic.com "Streaming Messages"; contract points in harnesses.md §6):

* indices are 0-based and contiguous; every block is ``content_block_start`` → deltas →
  ``content_block_stop``;
* whitespace-only text or reasoning is held back until real content follows, so no empty (or
  blank) text block precedes a ``tool_use`` and no blank thinking block appears;
* every thinking block ends with a ``signature_delta`` (the SHA-256 of its text: non-empty and
  stable, so clients that drop unsigned thinking keep it and echo it back);
* a tool call is one ``tool_use`` block whose single ``input_json_delta`` carries the complete
  arguments object.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable

from freetoken.parsers.events import (
    ParserEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallEvent,
)
from freetoken.server.held_text import HeldWhitespace
from freetoken.server.ids import anthropic_tool_use_id

log = logging.getLogger("freetoken.server")


def thinking_signature(thinking: str) -> str:
    """Signature of a thinking block: SHA-256 hex digest of its UTF-8 text."""
    return hashlib.sha256(thinking.encode("utf-8")).hexdigest()


def _tool_input(arguments: str) -> dict:
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        log.warning("tool call arguments are not a JSON object: %r", arguments[:200])
        return {}
    return value


class BlockBuilder:
    """Feeds parser events, returns stream payloads, and accumulates the final ``content``.

    Attributes:
        blocks: the content blocks so far (``text`` / ``thinking`` with ``signature`` /
            ``tool_use`` with ``input`` as a dict).
        num_tool_uses: how many ``tool_use`` blocks were produced.
    """

    def __init__(self, new_tool_id: Callable[[], str] = anthropic_tool_use_id) -> None:
        self.blocks: list[dict] = []
        self.num_tool_uses = 0
        self._new_tool_id = new_tool_id
        self._open: str | None = None  # "text" | "thinking" while a block is open
        self._held = HeldWhitespace()

    def feed(self, event: ParserEvent) -> list[dict]:
        """Stream payloads (``content_block_*`` dicts) caused by ``event``."""
        if isinstance(event, TextDelta):
            return self._stream_text("text", event.text)
        if isinstance(event, ReasoningDelta):
            return self._stream_text("thinking", event.text)
        if isinstance(event, ToolCallEvent):
            return self._tool_use(event)
        raise TypeError(f"unexpected parser event {event!r}")

    def close(self) -> list[dict]:
        """Close the open block (if any); held-back whitespace is dropped."""
        self._held.drop()
        return self._close_open()

    def _stream_text(self, kind: str, text: str) -> list[dict]:
        if not text:
            return []
        field = "text" if kind == "text" else "thinking"
        out: list[dict] = []
        if self._open != kind:
            text = self._held.admit(kind, text)
            if text is None:
                return []
            out += self._close_open()
            start = (
                {"type": "text", "text": ""}
                if kind == "text"
                else {"type": "thinking", "thinking": "", "signature": ""}
            )
            out.append(self._start(start))
            self._open = kind
        index = len(self.blocks) - 1
        self.blocks[index][field] += text
        delta = (
            {"type": "text_delta", "text": text}
            if kind == "text"
            else {"type": "thinking_delta", "thinking": text}
        )
        out.append({"type": "content_block_delta", "index": index, "delta": delta})
        return out

    def _tool_use(self, event: ToolCallEvent) -> list[dict]:
        self._held.drop()
        out = self._close_open()
        tool_id = self._new_tool_id()
        out.append(
            self._start({"type": "tool_use", "id": tool_id, "name": event.name, "input": {}})
        )
        index = len(self.blocks) - 1
        self.blocks[index]["input"] = _tool_input(event.arguments)
        out.append(
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "input_json_delta", "partial_json": event.arguments},
            }
        )
        out.append({"type": "content_block_stop", "index": index})
        self.num_tool_uses += 1
        return out

    def _start(self, block: dict) -> dict:
        self.blocks.append(dict(block))
        return {
            "type": "content_block_start",
            "index": len(self.blocks) - 1,
            "content_block": block,
        }

    def _close_open(self) -> list[dict]:
        if self._open is None:
            return []
        index = len(self.blocks) - 1
        out: list[dict] = []
        if self._open == "thinking":
            signature = thinking_signature(self.blocks[index]["thinking"])
            self.blocks[index]["signature"] = signature
            out.append(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "signature_delta", "signature": signature},
                }
            )
        out.append({"type": "content_block_stop", "index": index})
        self._open = None
        return out
