"""Turns parser events into Responses API output items, as stream events and as final items.

One state machine serves both modes, so a streamed response and a non-streamed one carry the same
items (OpenAI "Responses" streaming events; shapes as the openai SDK's ``types/responses``):

* ``reasoning`` (``rs_…``): ``output_item.added`` → ``reasoning_summary_part.added`` →
  ``reasoning_summary_text.delta`` (one or more) → ``reasoning_summary_text.done`` →
  ``reasoning_summary_part.done`` → ``output_item.done``; the model's reasoning is reported
  whole as the item's single ``summary_text`` (nothing summarises it);
* ``message`` (``msg_…``): ``output_item.added`` → ``content_part.added`` →
  ``output_text.delta`` (one or more) → ``output_text.done`` → ``content_part.done`` →
  ``output_item.done``, one ``output_text`` part;
* ``function_call`` (``fc_…``, ``call_id`` ``call_…``): ``output_item.added`` (empty
  ``arguments``) → one ``function_call_arguments.delta`` with the complete arguments →
  ``function_call_arguments.done`` → ``output_item.done``;
* ``custom_tool_call`` (``ctc_…``), for a call of a declared ``custom`` tool:
  ``output_item.added`` (empty ``input``) → one ``custom_tool_call_input.delta`` with the whole input →
  ``custom_tool_call_input.done`` → ``output_item.done``.

Whitespace-only text or reasoning is held back until real content follows, so no blank message
precedes a call. Payloads carry ``type`` but no ``sequence_number`` (the stream numbers them).
"""

from __future__ import annotations

import copy

from freetoken.parsers.events import ParserEvent, ReasoningDelta, TextDelta, ToolCallEvent
from freetoken.server.held_text import HeldWhitespace
from freetoken.server.ids import openai_tool_call_id, output_item_id
from freetoken.server.openai_responses_tools import custom_input


class OutputBuilder:
    """Feeds parser events, returns stream payloads, and accumulates the final ``output``.

    ``custom_tools``: names whose calls are reported as ``custom_tool_call`` items.

    Attributes:
        items: the output items so far (each as the final ``output[]`` entry).
        reasoning: all reasoning text produced (for ``reasoning_tokens``).
    """

    def __init__(self, custom_tools: frozenset[str] = frozenset()) -> None:
        self.custom_tools = custom_tools
        self.items: list[dict] = []
        self.reasoning = ""
        self._open: str | None = None  # "message" | "reasoning" while an item streams
        self._held = HeldWhitespace()

    def feed(self, event: ParserEvent) -> list[dict]:
        """Stream payloads caused by ``event``."""
        if isinstance(event, TextDelta):
            return self._stream_text("message", event.text)
        if isinstance(event, ReasoningDelta):
            return self._stream_text("reasoning", event.text)
        if isinstance(event, ToolCallEvent):
            return self._function_call(event)
        raise TypeError(f"unexpected parser event {event!r}")

    def close(self, status: str = "completed") -> list[dict]:
        """Finish the open item (``status`` ``completed`` or ``incomplete``: generation was
        cut); held-back whitespace is dropped."""
        self._held.drop()
        return self._close_open(status)

    def _stream_text(self, kind: str, text: str) -> list[dict]:
        if not text:
            return []
        out: list[dict] = []
        if self._open != kind:
            text = self._held.admit(kind, text)
            if text is None:
                return []
            out += self._close_open("completed")
            out += self._start_text(kind)
        index = len(self.items) - 1
        item = self.items[index]
        if kind == "reasoning":
            item["summary"][0]["text"] += text
            self.reasoning += text
            out.append({"type": "response.reasoning_summary_text.delta", "item_id": item["id"],
                        "output_index": index, "summary_index": 0, "delta": text})
        else:
            item["content"][0]["text"] += text
            out.append({"type": "response.output_text.delta", "item_id": item["id"],
                        "output_index": index, "content_index": 0, "delta": text,
                        "logprobs": []})
        return out

    def _start_text(self, kind: str) -> list[dict]:
        index = len(self.items)
        if kind == "reasoning":
            item = {"id": output_item_id("rs"), "type": "reasoning", "summary": []}
            part = {"type": "summary_text", "text": ""}
            added = {"type": "response.reasoning_summary_part.added", "item_id": item["id"],
                     "output_index": index, "summary_index": 0, "part": dict(part)}
            final = {**item, "summary": [part]}
        else:
            item = {"id": output_item_id("msg"), "type": "message", "role": "assistant",
                    "status": "in_progress", "content": []}
            part = {"type": "output_text", "text": "", "annotations": []}
            added = {"type": "response.content_part.added", "item_id": item["id"],
                     "output_index": index, "content_index": 0, "part": copy.deepcopy(part)}
            final = {**item, "content": [part]}
        self.items.append(final)
        self._open = kind
        return [{"type": "response.output_item.added", "output_index": index, "item": item}, added]

    def _function_call(self, event: ToolCallEvent) -> list[dict]:
        self._held.drop()
        out = self._close_open("completed")
        if event.name in self.custom_tools:
            return out + self._custom_call(event.name, custom_input(event.arguments))
        index = len(self.items)
        item = {"id": output_item_id("fc"), "type": "function_call", "status": "in_progress",
                "call_id": openai_tool_call_id(), "name": event.name, "arguments": ""}
        out.append({"type": "response.output_item.added", "output_index": index,
                    "item": dict(item)})
        item.update(arguments=event.arguments, status="completed")
        self.items.append(item)
        out.append({"type": "response.function_call_arguments.delta", "item_id": item["id"],
                    "output_index": index, "delta": event.arguments})
        out.append({"type": "response.function_call_arguments.done", "item_id": item["id"],
                    "output_index": index, "name": event.name, "arguments": event.arguments})
        out.append({"type": "response.output_item.done", "output_index": index,
                    "item": dict(item)})
        return out

    def _custom_call(self, name: str, text: str) -> list[dict]:
        index = len(self.items)
        item = {"id": output_item_id("ctc"), "type": "custom_tool_call", "status": "in_progress",
                "call_id": openai_tool_call_id(), "name": name, "input": ""}
        out = [{"type": "response.output_item.added", "output_index": index,
                "item": dict(item)}]
        item.update(input=text, status="completed")
        self.items.append(item)
        out.append({"type": "response.custom_tool_call_input.delta", "item_id": item["id"],
                    "output_index": index, "delta": text})
        out.append({"type": "response.custom_tool_call_input.done", "item_id": item["id"],
                    "output_index": index, "input": text})
        out.append({"type": "response.output_item.done", "output_index": index,
                    "item": dict(item)})
        return out

    def _close_open(self, status: str) -> list[dict]:
        if self._open is None:
            return []
        index = len(self.items) - 1
        item = self.items[index]
        out: list[dict]
        if self._open == "reasoning":
            part = item["summary"][0]
            out = [
                {"type": "response.reasoning_summary_text.done", "item_id": item["id"],
                 "output_index": index, "summary_index": 0, "text": part["text"]},
                {"type": "response.reasoning_summary_part.done", "item_id": item["id"],
                 "output_index": index, "summary_index": 0, "part": dict(part)},
            ]
            if status != "completed":
                item["status"] = status
        else:
            part = item["content"][0]
            item["status"] = status
            out = [
                {"type": "response.output_text.done", "item_id": item["id"],
                 "output_index": index, "content_index": 0, "text": part["text"],
                 "logprobs": []},
                {"type": "response.content_part.done", "item_id": item["id"],
                 "output_index": index, "content_index": 0, "part": copy.deepcopy(part)},
            ]
        out.append({"type": "response.output_item.done", "output_index": index,
                    "item": copy.deepcopy(item)})
        self._open = None
        return out
