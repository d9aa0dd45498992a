"""Wire-level checks of what ``freetoken serve`` answered a real client.

``problems(exchange)`` returns the ways one recorded response breaks its API's contract: the
OpenAI Chat Completions stream (``chat.completion.chunk`` events, one ``finish_reason`` per choice,
a usage-only last chunk when ``stream_options.include_usage`` was asked, ``data: [DONE]``), the
non-streaming ``chat.completion`` object, and the Anthropic Messages stream (``message_start`` ...
``message_stop``, balanced ``content_block_start``/``stop`` per index, delta kinds matching their
block, tool input JSON that parses) or ``message`` object, and the OpenAI Responses stream
(``event:`` names equal to each payload's ``type``, ``sequence_number`` 0, 1, ...,
``response.created`` first and ``response.completed`` last, every output item added then done
once, the final ``output`` equal to the items done, function arguments that parse) or
``response`` object. Sources: the OpenAI API reference ("Create chat completion", "The chat
completion chunk object", "Responses" and its streaming events) and Anthropic's "Streaming
Messages".
"""

from __future__ import annotations

import json
from typing import Any

from .tap import Exchange

OPENAI_FINISH = {"stop", "length", "tool_calls", "content_filter"}
ANTHROPIC_STOP = {"end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal"}
RESPONSES_ITEMS = {"message", "reasoning", "function_call", "custom_tool_call"}
DELTA_FOR_BLOCK = {
    "text": {"text_delta"},
    "thinking": {"thinking_delta", "signature_delta"},
    "tool_use": {"input_json_delta"},
}


def sse_events(text: str) -> list[tuple[str | None, str]]:
    """Split a ``text/event-stream`` body into ``(event name or None, data)`` pairs.

    Follows the HTML "server-sent events" parsing rules: blank line ends an event, ``data`` lines
    join with newlines, lines starting with ``:`` are comments.
    """
    events: list[tuple[str | None, str]] = []
    name: str | None = None
    data: list[str] = []
    for line in text.replace("\r\n", "\n").split("\n"):
        if not line:
            if data:
                events.append((name, "\n".join(data)))
            name, data = None, []
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)
    if data:
        events.append((name, "\n".join(data)))
    return events


def problems(ex: Exchange) -> list[str]:
    """Contract violations in one exchange's response ([] when it is sound).

    HEAD and GET requests only need a complete, non-5xx answer; model calls must be 200.
    """
    if not ex.complete:
        return [f"response incomplete (status {ex.status})"]
    if ex.method in ("HEAD", "GET"):
        return [] if ex.status is not None and ex.status < 500 else [f"status {ex.status}"]
    body = ex.request_json()
    try:
        if ex.status != 200:
            return [f"status {ex.status}: {ex.response_text()[:300]}"]
        if not isinstance(body, dict):
            return ["request body is not a JSON object"]
        if ex.path.endswith("/chat/completions"):
            return _openai_stream(ex, body) if body.get("stream") else _openai_object(ex)
        if ex.path.endswith("/messages/count_tokens"):
            count = json.loads(ex.response_text()).get("input_tokens")
            return [] if isinstance(count, int) and count > 0 else [f"input_tokens {count!r}"]
        if ex.path.endswith("/messages"):
            return _anthropic_stream(ex) if body.get("stream") else _anthropic_object(ex)
        if ex.path.endswith("/responses"):
            return _responses_stream(ex) if body.get("stream") else _responses_object(
                json.loads(ex.response_text()))
    except (ValueError, KeyError, TypeError, IndexError, OSError, EOFError) as exc:
        return [f"malformed response: {type(exc).__name__}: {exc}"]
    return []


def _json_args(raw: Any, where: str) -> list[str]:
    if not isinstance(raw, str):
        return [f"{where}: arguments is {type(raw).__name__}, expected a JSON string"]
    try:
        return [] if isinstance(json.loads(raw), dict) else [f"{where}: arguments is not a JSON object"]
    except ValueError:
        return [f"{where}: arguments {raw[:120]!r} is not JSON"]


def _openai_object(ex: Exchange) -> list[str]:
    obj = json.loads(ex.response_text())
    out = [] if obj.get("object") == "chat.completion" else [f"object {obj.get('object')!r}"]
    if "error" in obj:
        out.append(f"error in body: {obj['error']}")
    for choice in obj["choices"]:
        message = choice["message"]
        if message.get("role") != "assistant":
            out.append(f"choice {choice['index']}: role {message.get('role')!r}")
        if choice.get("finish_reason") not in OPENAI_FINISH:
            out.append(f"choice {choice['index']}: finish_reason {choice.get('finish_reason')!r}")
        for call in message.get("tool_calls") or []:
            out += _json_args(call["function"].get("arguments"), f"tool call {call.get('id')}")
    if not isinstance(obj.get("usage", {}).get("completion_tokens"), int):
        out.append("usage.completion_tokens missing")
    return out


def _openai_stream(ex: Exchange, body: dict) -> list[str]:
    events = sse_events(ex.response_text())
    if not events or events[-1][1] != "[DONE]":
        return ["stream does not end with data: [DONE]"]
    chunks = [json.loads(data) for _, data in events[:-1]]
    out: list[str] = []
    finishes: dict[int, list[str]] = {}
    arguments: dict[tuple[int, int], str] = {}
    for chunk in chunks:
        if "error" in chunk:
            out.append(f"error chunk: {chunk['error']}")
            continue
        if chunk.get("object") != "chat.completion.chunk":
            out.append(f"chunk object {chunk.get('object')!r}")
        for choice in chunk["choices"]:
            if choice.get("finish_reason") is not None:
                finishes.setdefault(choice["index"], []).append(choice["finish_reason"])
            for call in choice.get("delta", {}).get("tool_calls") or []:
                key = (choice["index"], call["index"])
                arguments[key] = arguments.get(key, "") + (call.get("function", {}).get("arguments") or "")
    for index, reasons in sorted(finishes.items()):
        if len(reasons) != 1 or reasons[0] not in OPENAI_FINISH:
            out.append(f"choice {index}: finish_reason sequence {reasons}")
    if not finishes:
        out.append("no chunk carries a finish_reason")
    for (index, call), raw in sorted(arguments.items()):
        out += _json_args(raw, f"choice {index} tool call {call}")
    if (body.get("stream_options") or {}).get("include_usage"):
        last = chunks[-1] if chunks else {}
        if last.get("choices") != [] or not isinstance((last.get("usage") or {}).get("prompt_tokens"), int):
            out.append("include_usage asked but the last chunk is not a usage-only chunk")
    return out


def _anthropic_object(ex: Exchange) -> list[str]:
    obj = json.loads(ex.response_text())
    out = [] if obj.get("type") == "message" else [f"type {obj.get('type')!r}: {str(obj)[:300]}"]
    if obj.get("stop_reason") not in ANTHROPIC_STOP:
        out.append(f"stop_reason {obj.get('stop_reason')!r}")
    for block in obj.get("content", []):
        if block.get("type") == "tool_use" and not isinstance(block.get("input"), dict):
            out.append(f"tool_use {block.get('id')}: input is not an object")
    return out


def _anthropic_stream(ex: Exchange) -> list[str]:
    events = sse_events(ex.response_text())
    out: list[str] = []
    kinds = [name for name, _ in events if name != "ping"]
    if not kinds or kinds[0] != "message_start" or kinds[-1] != "message_stop":
        out.append(f"event order {kinds[:3]} ... {kinds[-2:]}")
    open_blocks: dict[int, str] = {}
    closed: set[int] = set()
    tool_json: dict[int, str] = {}
    stop_reasons: list[Any] = []
    for name, data in events:
        payload = json.loads(data)
        if payload.get("type") != name:
            out.append(f"event {name!r} carries type {payload.get('type')!r}")
        if name == "error":
            out.append(f"error event: {payload.get('error')}")
        elif name == "content_block_start":
            index, kind = payload["index"], payload["content_block"]["type"]
            if index in open_blocks or index in closed:
                out.append(f"block {index} started twice")
            open_blocks[index] = kind
        elif name == "content_block_delta":
            index, delta = payload["index"], payload["delta"]["type"]
            kind = open_blocks.get(index)
            if kind is None:
                out.append(f"delta for block {index} that is not open")
            elif kind in DELTA_FOR_BLOCK and delta not in DELTA_FOR_BLOCK[kind]:
                out.append(f"{delta} inside a {kind} block")
            if delta == "input_json_delta":
                tool_json[index] = tool_json.get(index, "") + payload["delta"]["partial_json"]
        elif name == "content_block_stop":
            if open_blocks.pop(payload["index"], None) is None:
                out.append(f"stop for block {payload['index']} that is not open")
            closed.add(payload["index"])
        elif name == "message_delta":
            stop_reasons.append(payload["delta"].get("stop_reason"))
    if open_blocks:
        out.append(f"blocks never stopped: {sorted(open_blocks)}")
    if len(stop_reasons) != 1 or stop_reasons[0] not in ANTHROPIC_STOP:
        out.append(f"message_delta stop_reason sequence {stop_reasons}")
    for index, raw in sorted(tool_json.items()):
        try:
            if not isinstance(json.loads(raw or "{}"), dict):
                out.append(f"tool_use block {index}: input is not an object")
        except ValueError:
            out.append(f"tool_use block {index}: input JSON {raw[:120]!r} does not parse")
    return out


def _responses_object(obj: dict) -> list[str]:
    """A completed ``response`` object: status, output item shapes and usage."""
    out = [] if obj.get("object") == "response" else [f"object {obj.get('object')!r}"]
    if obj.get("status") != "completed" or obj.get("error") is not None:
        out.append(f"status {obj.get('status')!r}, error {obj.get('error')!r}")
    for item in obj.get("output", []):
        if item.get("type") not in RESPONSES_ITEMS:
            out.append(f"output item type {item.get('type')!r}")
        elif item["type"] == "function_call":
            out += _json_args(item.get("arguments"), f"function_call {item.get('call_id')}")
        if item.get("type") != "reasoning" and item.get("status") != "completed":
            out.append(f"output item {item.get('id')} status {item.get('status')!r}")
    usage = obj.get("usage") or {}
    if not all(isinstance(usage.get(k), int) for k in ("input_tokens", "output_tokens")):
        out.append(f"usage {usage!r}")
    return out


def _responses_stream(ex: Exchange) -> list[str]:
    events = sse_events(ex.response_text())
    payloads = [json.loads(data) for _, data in events]
    out = [f"event {name!r} carries type {p.get('type')!r}"
           for (name, _), p in zip(events, payloads) if name != p.get("type")]
    numbers = [p.get("sequence_number") for p in payloads]
    if numbers != list(range(len(payloads))):
        out.append(f"sequence numbers {numbers[:5]}... are not 0, 1, ...")
    kinds = [p.get("type") for p in payloads]
    if kinds[:2] != ["response.created", "response.in_progress"] or kinds[-1:] != [
            "response.completed"]:
        return out + [f"event order {kinds[:2]} ... {kinds[-1:]}"]
    added: dict[int, dict] = {}
    done: dict[int, dict] = {}
    for p in payloads:
        if p["type"] == "response.output_item.added":
            if p["output_index"] in added:
                out.append(f"output item {p['output_index']} added twice")
            added[p["output_index"]] = p["item"]
        elif p["type"] == "response.output_item.done":
            if p["output_index"] not in added or p["output_index"] in done:
                out.append(f"output item {p['output_index']} done without being added once")
            done[p["output_index"]] = p["item"]
    final = payloads[-1]["response"]
    if sorted(added) != sorted(done) or [done[i] for i in sorted(done)] != final.get("output"):
        out.append("the final output is not the items added and done")
    return out + _responses_object(final)
