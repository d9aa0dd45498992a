"""Wire-format conversion of recorded conversations: Anthropic Messages <-> OpenAI chat.

The replay keeps one canonical form per call, the OpenAI chat wire format, which is also (up to
content lists) the template form the harness adapters' edit simulators take
(``harness_adapters/base.py``): messages ``{"role": system|user|assistant|tool, "content": str |
[text parts] | None}``, assistant ``tool_calls`` (``[{"id", "type": "function", "function":
{"name", "arguments": str}}]``) and ``reasoning_content``, tool messages with ``tool_call_id``.

Mapping (both directions; Anthropic Messages API and OpenAI Chat Completions API references):

* Anthropic ``system`` (string or text blocks) <-> leading ``system`` messages; a system message
  elsewhere in the history becomes a user text block (the Messages API has no system turn).
* ``text`` blocks <-> text parts; ``thinking`` blocks <-> ``reasoning_content``;
  ``redacted_thinking`` is dropped; ``tool_use`` (``input`` object) <-> ``tool_calls``
  (``arguments`` JSON text); a ``tool_result`` block <-> a ``tool`` message (its text; an
  empty error result reads ``Error``); image/document blocks become ``[image omitted]``-style
  text, as the FreeToken server renders them in tool results.
* Consecutive ``tool`` / ``user`` messages become one Anthropic user turn (the Messages API
  alternates roles); an OpenAI tool message without ``tool_call_id`` (the Gemini capture) takes
  the id of the matching call of the preceding assistant message, by position.
* Tools: ``{"name", "description", "input_schema"}`` <-> ``{"type": "function", "function":
  {"name", "description", "parameters"}}``.

Everything here is pure (inputs are never modified) and raises ``ValueError`` naming the
message index for shapes neither API allows.
"""

from __future__ import annotations

import json
from typing import Any

_MEDIA = frozenset({"image", "image_url", "input_image", "document", "input_audio", "file"})


def _media_text(kind: str) -> str:
    return f"[{kind} omitted]"


def block_text(content: Any) -> str:
    """Text of a content value: the string itself, or the text blocks/parts joined with
    ``"\\n"`` (media blocks as ``[kind omitted]``, other blocks ignored); ``""`` for None."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    out = []
    for part in content if isinstance(content, list) else []:
        if not isinstance(part, dict):
            continue
        kind = part.get("type", "text")
        if kind == "text":
            out.append(str(part.get("text", "")))
        elif kind in _MEDIA:
            out.append(_media_text(kind))
    return "\n".join(out)


def _text_parts(content: Any) -> str | list[dict]:
    """Content for an OpenAI message: a string stays, text blocks become text parts (cache
    markers dropped), media become placeholder text parts."""
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        kind = part.get("type", "text") if isinstance(part, dict) else None
        if kind == "text":
            parts.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind in _MEDIA:
            parts.append({"type": "text", "text": _media_text(kind)})
    return parts


# ------------------------------------------------------------------ Anthropic -> canonical
def anthropic_to_canonical(messages: list[dict]) -> list[dict]:
    """Recorded Anthropic history (leading ``{"role": "system"}`` message holding the top-level
    ``system`` value, as the traces store it) -> canonical OpenAI chat messages.

    A user turn's ``tool_result`` blocks become ``tool`` messages in block order; its text blocks
    around them become user messages (the FreeToken server's ``from_anthropic`` does the same).

    Raises:
        ValueError: a message that is not an object or has an unknown role.
    """
    out: list[dict] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise ValueError(f"messages[{i}] must be an object, got {type(msg).__name__}")
        role, content = msg.get("role"), msg.get("content")
        if role == "system":
            out.append({"role": "system", "content": block_text(content)})
        elif role == "user":
            out.extend(_anthropic_user(content))
        elif role == "assistant":
            out.append(anthropic_assistant_to_canonical(content))
        else:
            raise ValueError(f"messages[{i}].role must be system, user or assistant, got {role!r}")
    return out


def _anthropic_user(content: Any) -> list[dict]:
    if not isinstance(content, list):
        return [{"role": "user", "content": block_text(content)}]
    out: list[dict] = []
    pending: list[dict] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "tool_result":
            if pending:
                out.append({"role": "user", "content": _text_parts(pending)})
                pending = []
            text = block_text(block.get("content"))
            if block.get("is_error") and not text:
                text = "Error"
            out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")),
                        "content": text})
        else:
            pending.append(block)
    if pending or not out:
        out.append({"role": "user", "content": _text_parts(pending)})
    return out


def anthropic_assistant_to_canonical(content: Any) -> dict:
    """One recorded Anthropic assistant turn (string or blocks) as a canonical message."""
    if not isinstance(content, list):
        return {"role": "assistant", "content": block_text(content)}
    texts, thoughts, calls = [], [], []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "thinking":
            thoughts.append(str(block.get("thinking", "")))
        elif kind == "tool_use":
            calls.append({"id": str(block.get("id", "")), "type": "function", "function": {
                "name": str(block.get("name", "")),
                "arguments": json.dumps(block.get("input") or {}, ensure_ascii=False)}})
    msg: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) if texts else None}
    if thoughts:
        msg["reasoning_content"] = "\n".join(thoughts)
    if calls:
        msg["tool_calls"] = calls
    if msg["content"] is None and not calls:
        msg["content"] = ""
    return msg


# ------------------------------------------------------------------ OpenAI -> canonical
def openai_to_canonical(messages: list[dict]) -> list[dict]:
    """Recorded OpenAI chat history -> canonical messages: ``thinking`` becomes
    ``reasoning_content``, ``developer`` becomes ``system``, a tool message without
    ``tool_call_id`` gets the id of the preceding assistant's call at its position, response-only
    fields (``usage``, ``finish_reason``, ``model``, ``name`` of Gemini tool messages) go.

    Raises:
        ValueError: a message that is not an object or has an unknown role.
    """
    out: list[dict] = []
    call_ids: list[str] = []
    nth_tool = 0
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise ValueError(f"messages[{i}] must be an object, got {type(msg).__name__}")
        role = msg.get("role")
        if role in ("system", "developer", "user"):
            out.append({"role": "system" if role == "developer" else role,
                        "content": _text_parts(msg.get("content"))})
        elif role == "assistant":
            out.append(openai_assistant_to_canonical(msg))
            call_ids = [c["id"] for c in out[-1].get("tool_calls", [])]
            nth_tool = 0
        elif role == "tool":
            call_id = msg.get("tool_call_id")
            if not call_id:
                call_id = call_ids[nth_tool] if nth_tool < len(call_ids) else f"call_{i}"
            nth_tool += 1
            out.append({"role": "tool", "tool_call_id": str(call_id),
                        "content": block_text(msg.get("content"))})
        else:
            raise ValueError(f"messages[{i}].role must be system, developer, user, assistant or "
                             f"tool, got {role!r}")
    return out


def openai_assistant_to_canonical(msg: dict) -> dict:
    """One recorded OpenAI assistant message (or response) as a canonical message; list
    content (the OpenClaw captures) is kept as text parts, tool-call arguments become JSON
    text."""
    out: dict[str, Any] = {"role": "assistant", "content": _text_parts(msg.get("content"))
                           if msg.get("content") is not None else None}
    reasoning = msg.get("reasoning_content") or msg.get("thinking") or msg.get("reasoning")
    if reasoning:
        out["reasoning_content"] = str(reasoning)
    calls = []
    for j, call in enumerate(msg.get("tool_calls") or []):
        fn = call.get("function") or {}
        args = fn.get("arguments", "")
        calls.append({"id": str(call.get("id") or f"call_{j}"), "type": "function", "function": {
            "name": str(fn.get("name", "")),
            "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}})
    if calls:
        out["tool_calls"] = calls
    elif out["content"] is None:
        out["content"] = ""
    return out


# ------------------------------------------------------------------ canonical -> Anthropic
def canonical_to_anthropic(messages: list[dict]) -> tuple[str | None, list[dict]]:
    """Canonical messages -> ``(system, messages)`` of an Anthropic Messages request.

    Leading system messages join (``"\\n\\n"``) into ``system``; consecutive user/tool messages
    merge into one user turn (tool results first as they come); an assistant message with no
    text, reasoning or calls gets one empty-string content (the API rejects empty block lists).

    Raises:
        ValueError: an unknown role.
    """
    head = 0
    while head < len(messages) and messages[head].get("role") == "system":
        head += 1
    system = "\n\n".join(block_text(m.get("content")) for m in messages[:head]) or None
    out: list[dict] = []
    for i, msg in enumerate(messages[head:], start=head):
        role = msg.get("role")
        if role == "assistant":
            out.append({"role": "assistant", "content": _assistant_blocks(msg)})
            continue
        if role == "tool":
            block: dict = {"type": "tool_result", "tool_use_id": str(msg.get("tool_call_id", "")),
                           "content": block_text(msg.get("content"))}
            blocks = [block]
        elif role in ("user", "system"):
            text = block_text(msg.get("content"))
            blocks = [{"type": "text", "text": text}] if text else []
        else:
            raise ValueError(f"messages[{i}].role {role!r} has no Anthropic equivalent")
        if out and out[-1]["role"] == "user":
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": "user", "content": blocks})
    for msg in out:  # a user turn must not be empty
        if msg["role"] == "user" and not msg["content"]:
            msg["content"] = [{"type": "text", "text": "(empty)"}]
    return system, out


def _assistant_blocks(msg: dict) -> list[dict] | str:
    blocks: list[dict] = []
    if msg.get("reasoning_content"):
        blocks.append({"type": "thinking", "thinking": str(msg["reasoning_content"])})
    text = block_text(msg.get("content"))
    if text:
        blocks.append({"type": "text", "text": text})
    for call in msg.get("tool_calls") or []:
        fn = call.get("function") or {}
        blocks.append({"type": "tool_use", "id": str(call.get("id", "")),
                       "name": str(fn.get("name", "")), "input": parse_input(fn.get("arguments"))})
    return blocks or ""


def parse_input(arguments: Any) -> dict:
    """Tool-call ``arguments`` (JSON text or an object) as an Anthropic ``input`` object; text
    that is not a JSON object is kept under ``{"arguments": text}``."""
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments or "{}")
    except (TypeError, ValueError):
        return {"arguments": str(arguments)}
    return value if isinstance(value, dict) else {"arguments": str(arguments)}


# ------------------------------------------------------------------ tools
def tools_to_openai(tools: list[dict] | None) -> list[dict] | None:
    """Tool definitions in either wire format -> OpenAI ``tools`` (None stays None)."""
    if tools is None:
        return None
    out = []
    for tool in tools:
        if "function" in tool:
            out.append(tool)
        else:
            fn = {"name": tool.get("name", ""), "parameters": tool.get("input_schema") or
                  {"type": "object", "properties": {}}}
            if tool.get("description"):
                fn["description"] = tool["description"]
            out.append({"type": "function", "function": fn})
    return out


def tools_to_anthropic(tools: list[dict] | None) -> list[dict] | None:
    """Tool definitions in either wire format -> Anthropic ``tools`` (None stays None)."""
    if tools is None:
        return None
    out = []
    for tool in tools:
        fn = tool.get("function")
        if not isinstance(fn, dict):
            out.append(tool)
            continue
        item = {"name": fn.get("name", ""), "input_schema": fn.get("parameters") or
                {"type": "object", "properties": {}}}
        if fn.get("description"):
            item["description"] = fn["description"]
        out.append(item)
    return out
