"""Turns request messages and tools into the plain data a chat template sees.

What it does, in order (the first three follow ``transformers`` ``apply_chat_template``):

1. rebuilds every value from plain JSON types (``str``, ``int``, ``float``, ``bool``, ``None``,
   ``dict``, ``list``/``tuple``), so no object with methods reaches the sandbox;
2. drops message keys whose value is ``None`` (OpenAI clients send ``content: null`` next to
   ``tool_calls``; templates test for a missing key, not for ``None``);
3. copies ``reasoning`` / ``thinking`` into ``reasoning_content`` when that is absent;
4. optionally flattens a ``content`` list made only of text parts (``{"type": "text", "text": …}``)
   into one string, so templates that only handle strings (the TRL-style Qwen3 copies render a list
   as ``''``) do not silently lose the message;
5. optionally parses tool-call ``arguments`` given as a JSON-object string into a dict, which is
   what HF templates expect; a JSON-form template then re-serialises them with ``tojson`` exactly
   as the model wrote them, and XML-form templates (Qwen3.5) can iterate them. Strings that are not
   a JSON object are left as they are.
"""

from __future__ import annotations

import json
from typing import Any

_REASONING_ALIASES = ("reasoning", "thinking")


class MessageFormatError(ValueError):
    """A message or tool list has a shape no template can render (bad role, non-JSON value…)."""


def plain_data(value: Any, where: str) -> Any:
    """Deep copy of ``value`` made only of plain JSON types.

    Raises:
        MessageFormatError: a value of another type (names its location ``where``).
    """
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise MessageFormatError(f"{where} has a non-string key {key!r}")
            out[str.__str__(key)] = plain_data(item, f"{where}.{key}")
        return out
    if isinstance(value, (list, tuple)):
        return [plain_data(item, f"{where}[{i}]") for i, item in enumerate(value)]
    raise MessageFormatError(f"{where} has a value of unsupported type {type(value).__name__}")


def _flatten_text_parts(content: Any) -> Any:
    if not isinstance(content, list):
        return content
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type", "text") != "text":
            return content
        if not isinstance(part.get("text"), str):
            return content
        texts.append(part["text"])
    return "".join(texts)


def parse_arguments(raw: Any) -> Any:
    """Tool-call arguments for rendering: a dict when ``raw`` is (or parses to) a JSON object,
    else ``raw`` unchanged (templates then emit the string verbatim)."""
    if not isinstance(raw, str):
        return raw
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    return value if isinstance(value, dict) else raw


def _parse_arguments(call: dict) -> None:
    holder = call.get("function") if isinstance(call.get("function"), dict) else call
    if "arguments" in holder:
        holder["arguments"] = parse_arguments(holder["arguments"])


def normalize_messages(
    messages: Any, *, flatten_text_parts: bool = True, parse_tool_arguments: bool = True
) -> list[dict]:
    """Plain-data copy of ``messages`` ready for rendering (see the module docstring).

    Args:
        messages: OpenAI-style message dicts, each with a string ``role``.
        flatten_text_parts: join a content list made only of text parts into one string.
        parse_tool_arguments: replace JSON-object ``arguments`` strings by dicts.

    Raises:
        MessageFormatError: ``messages`` is not a list of dicts with a string ``role``, or holds a
            value that is not plain JSON data.
    """
    if not isinstance(messages, (list, tuple)):
        raise MessageFormatError(f"messages must be a list, got {type(messages).__name__}")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise MessageFormatError(f"{where} must be an object, got {type(message).__name__}")
        msg = {k: v for k, v in plain_data(message, where).items() if v is not None}
        if not isinstance(msg.get("role"), str):
            raise MessageFormatError(f"{where} has no string 'role'")
        if "reasoning_content" not in msg:
            for alias in _REASONING_ALIASES:
                if isinstance(msg.get(alias), str):
                    msg["reasoning_content"] = msg[alias]
                    break
        if flatten_text_parts and "content" in msg:
            msg["content"] = _flatten_text_parts(msg["content"])
        if parse_tool_arguments and isinstance(msg.get("tool_calls"), list):
            for call in msg["tool_calls"]:
                if isinstance(call, dict):
                    _parse_arguments(call)
        out.append(msg)
    return out


def normalize_tools(tools: Any) -> list[dict] | None:
    """Plain-data copy of the tool list (``None`` and ``[]`` both mean no tools → ``None``).

    Raises:
        MessageFormatError: ``tools`` is not a list of objects.
    """
    if tools is None:
        return None
    if not isinstance(tools, (list, tuple)):
        raise MessageFormatError(f"tools must be a list, got {type(tools).__name__}")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise MessageFormatError(f"tools[{i}] must be an object, got {type(tool).__name__}")
        out.append(plain_data(tool, f"tools[{i}]"))
    return out or None
