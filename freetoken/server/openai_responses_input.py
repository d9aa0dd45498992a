"""Responses API input items → the template messages the chat path renders (see
:mod:`freetoken.server.messages` for the target form).

One model turn arrives as several items (``reasoning``, an assistant ``message``,
``function_call`` items); they are folded back into one assistant message (``reasoning_content``,
``content``, ``tool_calls``) so a turn renders exactly as the chat endpoint renders it, and a
conversation that grows item by item renders to a prompt that grows append-only:

* ``reasoning`` opens a new assistant message carrying it;
* an assistant ``message`` fills the open assistant message when that one has no text and no
  calls yet, else opens a new one;
* ``function_call`` joins the open assistant message (else opens one);
* ``function_call_output`` becomes a ``tool`` message; user / system / developer messages become
  their own messages (``developer`` as ``system``), closing the assistant turn;
* ``custom_tool_call`` joins the open assistant message as a call with arguments
  ``{"input": <text>}`` (the function form the model saw, see
  :mod:`freetoken.server.openai_responses_tools`), ``custom_tool_call_output`` is a ``tool``
  message; ``local_shell_call`` is a call of ``local_shell`` with its ``action`` as arguments;
* ``web_search_call`` and ``image_generation_call`` (hosted tools this server never runs, kept
  in an agent's history from another provider) are skipped.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from freetoken.server.errors import bad_request, from_validation_error
from freetoken.chat.messages import parse_arguments
from freetoken.server.messages import MEDIA_PLACEHOLDER
from freetoken.server.openai_responses_protocol import (
    CustomToolCallItem,
    CustomToolCallOutputItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputMessage,
    LocalShellCallItem,
    ReasoningItem,
)
from freetoken.server.openai_responses_tools import CUSTOM_INPUT

_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
_MEDIA_PARTS = frozenset({"input_image", "input_file", "input_audio", "image", "file"})
_ITEMS: dict[str, type[BaseModel]] = {
    "message": InputMessage,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem,
    "custom_tool_call": CustomToolCallItem,
    "custom_tool_call_output": CustomToolCallOutputItem,
    "local_shell_call": LocalShellCallItem,
}
_SKIPPED_ITEMS = frozenset({"web_search_call", "image_generation_call"})


def _validate(model: type[BaseModel], item: dict, path: str) -> Any:
    try:
        return model.model_validate(item)
    except ValidationError as exc:
        raise from_validation_error(exc, prefix=path) from None


def _parts_text(parts: str | list[dict[str, Any]], path: str, *, omit_media: bool) -> str:
    """Text of a content given as a string or parts, joined with newlines.

    Raises:
        APIError: 400 for a media part (unless ``omit_media``: tool output keeps a placeholder
            line so the history stays valid) or a part of another type.
    """
    if isinstance(parts, str):
        return parts
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type")
        where = f"{path}.{j}"
        if kind in _TEXT_PARTS or kind == "refusal":
            key = "refusal" if kind == "refusal" else "text"
            value = part.get(key)
            if not isinstance(value, str):
                raise bad_request(f"{where}.{key}: Input should be a valid string",
                                  param=f"{where}.{key}")
            texts.append(value)
        elif kind in _MEDIA_PARTS and omit_media:
            texts.append(MEDIA_PLACEHOLDER.format(kind=kind))
        elif kind in _MEDIA_PARTS:
            raise bad_request(
                f"{where}: {kind} content is not supported by this server (text-only model)",
                param=where,
            )
        else:
            raise bad_request(f"{where}.type: unsupported content type {kind!r}",
                              param=f"{where}.type")
    return "\n".join(texts)


def _reasoning_text(item: ReasoningItem) -> str:
    parts = item.content if item.content else item.summary
    return "\n".join(p["text"] for p in parts if isinstance(p.get("text"), str))


def _open_assistant(out: list[dict]) -> dict:
    """The assistant message a turn's next item joins: the last message when it is one."""
    if out and out[-1]["role"] == "assistant":
        return out[-1]
    out.append({"role": "assistant", "content": ""})
    return out[-1]


def _add_message(out: list[dict], msg: InputMessage, path: str) -> None:
    text = _parts_text(msg.content, f"{path}.content", omit_media=False)
    if msg.role in ("system", "developer"):
        out.append({"role": "system", "content": text})
    elif msg.role == "user":
        out.append({"role": "user", "content": text})
    else:
        last = out[-1] if out else None
        fillable = (last is not None and last["role"] == "assistant"
                    and not last["content"] and not last.get("tool_calls"))
        if fillable:
            last["content"] = text
        else:
            out.append({"role": "assistant", "content": text})


def input_messages(items: list[dict[str, Any]] | tuple[dict[str, Any], ...],
                   path: str = "input", out: list[dict] | None = None) -> list[dict]:
    """Template messages of a list of Responses input items (see module docstring).

    Args:
        items: the raw items (``type`` defaults to ``message``, the SDKs' easy input form).
        path: the field the items came from, for error messages.
        out: messages to extend (an earlier part of the conversation: a turn split across the
            boundary still folds into one message); default a new list. Returned.

    Raises:
        APIError: 400 naming the item path for a non-object item, an unsupported item type
            (``item_reference``, ``file_search_call``...), a missing or invalid field, or non-text
            content outside tool output.
    """
    out = [] if out is None else out
    for i, raw in enumerate(items):
        where = f"{path}.{i}"
        if not isinstance(raw, dict):
            raise bad_request(f"{where}: Input should be an object", param=where)
        kind = raw.get("type", "message")
        if kind in _SKIPPED_ITEMS:
            continue
        model = _ITEMS.get(kind) if isinstance(kind, str) else None
        if model is None:
            raise bad_request(f"{where}.type: unsupported input item type {kind!r}",
                              param=f"{where}.type")
        item = _validate(model, raw, where)
        if isinstance(item, InputMessage):
            _add_message(out, item, where)
        elif isinstance(item, ReasoningItem):
            text = _reasoning_text(item)
            if text:
                out.append({"role": "assistant", "content": "", "reasoning_content": text})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name,
                                 "arguments": parse_arguments(item.arguments)}}
            _open_assistant(out).setdefault("tool_calls", []).append(call)
        elif isinstance(item, (CustomToolCallItem, LocalShellCallItem)):
            name, args = ((item.name, {CUSTOM_INPUT: item.input})
                          if isinstance(item, CustomToolCallItem) else ("local_shell", item.action))
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": name, "arguments": args}}
            _open_assistant(out).setdefault("tool_calls", []).append(call)
        else:
            text = _parts_text(item.output, f"{where}.output", omit_media=True)
            out.append({"role": "tool", "content": text, "tool_call_id": item.call_id})
    return out
