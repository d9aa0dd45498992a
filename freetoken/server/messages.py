"""Normalises OpenAI and Anthropic conversations into the message dicts ChatTemplate renders.

Target form (see :class:`freetoken.chat.template.ChatTemplate`): ``{"role": "system"|"user"|
"assistant"|"tool", "content": str}``; assistant messages may add ``reasoning_content`` (str) and
``tool_calls`` (``[{"id", "type": "function", "function": {"name", "arguments"}}]``, arguments a
dict when they parse as a JSON object, else the raw string); tool messages carry
``tool_call_id``. Multi-part text is joined with ``"\\n"``. Messages are never reordered or merged
(within an Anthropic user turn the tool results come before its text, as that API requires),
so a conversation that grows append-only renders to a prompt that grows append-only (prefix
caching depends on this; harnesses.md §8 "Engine implications").
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from freetoken.chat.messages import parse_arguments
from freetoken.server.anthropic_protocol import AnthropicMessage
from freetoken.server.errors import bad_request, from_validation_error
from freetoken.server.openai_protocol import ChatMessage

# Claude Code's per-request attribution block (system[0]); it carries a nonce that would change
# the first prompt tokens on every request and defeat prefix caching (harnesses.md §5b C1).
BILLING_HEADER_PREFIX = "x-anthropic-billing-header:"
_IMAGE_TYPES = frozenset({"image", "image_url", "input_image", "document", "input_audio", "file"})
MEDIA_PLACEHOLDER = "[{kind} omitted: this model reads text only]"
"""Text standing in for a non-text block inside a tool result (see :func:`text_of`)."""


class _Block(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _TextBlock(_Block):
    text: str


class _ToolUseBlock(_Block):
    id: str
    name: str
    input: dict[str, Any] = {}


class _ToolResultBlock(_Block):
    tool_use_id: str
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = None


class _ThinkingBlock(_Block):
    thinking: str
    signature: str | None = None


def _validate(model: type[_Block], block: dict, path: str) -> Any:
    try:
        return model.model_validate(block)
    except ValidationError as exc:
        raise from_validation_error(exc, prefix=path) from None


def _unsupported(kind: object, path: str) -> Exception:
    if kind in _IMAGE_TYPES:
        return bad_request(
            f"{path}: {kind} content is not supported by this server (text-only model)", param=path
        )
    return bad_request(f"{path}.type: unsupported content type {kind!r}", param=f"{path}.type")


def text_of(
    content: str | list[dict[str, Any]] | None, path: str, *, omit_media: bool = False
) -> str:
    """Text of a content given as a string, a list of ``text`` parts/blocks, or None.

    Args:
        omit_media: replace image/document parts with :data:`MEDIA_PLACEHOLDER` instead of
            rejecting them. Used for tool results: an agent's file-reading tool returns an image
            block when the model opens a picture, and a 400 there would break every later turn
            of the session (the block stays in the history).

    Raises:
        APIError: 400 for image/document parts (unless ``omit_media``) or any other non-text
            part, naming its path.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type")
        if omit_media and kind in _IMAGE_TYPES:
            texts.append(MEDIA_PLACEHOLDER.format(kind=kind))
            continue
        if kind != "text":
            raise _unsupported(kind, f"{path}.{j}")
        texts.append(_validate(_TextBlock, part, f"{path}.{j}").text)
    return "\n".join(texts)


def from_openai(messages: list[ChatMessage]) -> list[dict]:
    """OpenAI chat messages → template messages (``developer`` becomes ``system``; an image part
    of a ``tool`` message becomes a placeholder line, as in Anthropic tool results).

    Raises:
        APIError: 400 for non-text content parts outside tool messages, or a tool message
            without ``tool_call_id``.
    """
    out: list[dict] = []
    for i, msg in enumerate(messages):
        text = text_of(msg.content, f"messages.{i}.content", omit_media=msg.role == "tool")
        if msg.role in ("system", "developer"):
            out.append({"role": "system", "content": text})
        elif msg.role == "user":
            out.append({"role": "user", "content": text})
        elif msg.role == "tool":
            if msg.tool_call_id is None:
                raise bad_request(
                    f"messages.{i}.tool_call_id: Field required", param=f"messages.{i}.tool_call_id"
                )
            out.append({"role": "tool", "content": text, "tool_call_id": msg.tool_call_id})
        else:
            item: dict[str, Any] = {"role": "assistant", "content": text}
            reasoning = (
                msg.reasoning_content if msg.reasoning_content is not None else msg.reasoning
            )
            if reasoning:
                item["reasoning_content"] = reasoning
            if msg.tool_calls:
                item["tool_calls"] = [
                    {
                        "id": call.id or "",
                        "type": "function",
                        "function": {
                            "name": call.function.name,
                            "arguments": parse_arguments(call.function.arguments),
                        },
                    }
                    for call in msg.tool_calls
                ]
            out.append(item)
    return out


def anthropic_system(system: str | list[dict[str, Any]] | None) -> list[dict]:
    """The top-level ``system`` (string or text blocks) as zero or one system message; blocks
    are joined with newlines. Claude Code's per-request attribution block is kept here: its
    harness adapter (``harness_adapters.claude_code``) removes it before templating.

    Raises:
        APIError: 400 for a non-text system block.
    """
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}] if system else []
    blocks = []
    for j, block in enumerate(system):
        if block.get("type") != "text":
            raise _unsupported(block.get("type"), f"system.{j}")
        blocks.append(_validate(_TextBlock, block, f"system.{j}").text)
    return [{"role": "system", "content": "\n".join(blocks)}] if blocks else []


def _tool_result(block: dict, path: str) -> dict:
    result = _validate(_ToolResultBlock, block, path)
    text = text_of(result.content, f"{path}.content", omit_media=True)
    if result.is_error and not text:
        text = "Error"
    return {"role": "tool", "content": text, "tool_call_id": result.tool_use_id}


def _user_turn(content: str | list[dict[str, Any]], path: str) -> list[dict]:
    """A user turn's ``tool`` messages (block order), then its text as one user message.

    Anthropic's API requires the ``tool_result`` blocks first; a harness that puts text before
    them means the same turn, and rendering the text between the calls and their results would
    part each result from its call (and from the prompt cached up to the results)."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out: list[dict] = []
    texts: list[str] = []
    for j, block in enumerate(content):
        kind = block.get("type")
        if kind == "text":
            texts.append(_validate(_TextBlock, block, f"{path}.{j}").text)
        elif kind == "tool_result":
            out.append(_tool_result(block, f"{path}.{j}"))
        else:
            raise _unsupported(kind, f"{path}.{j}")
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _assistant_turn(content: str | list[dict[str, Any]], path: str) -> dict:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict] = []
    for j, block in enumerate(content):
        kind = block.get("type")
        if kind == "text":
            texts.append(_validate(_TextBlock, block, f"{path}.{j}").text)
        elif kind == "thinking":
            thoughts.append(_validate(_ThinkingBlock, block, f"{path}.{j}").thinking)
        elif kind == "redacted_thinking":
            continue  # opaque provider data: nothing a local model can read
        elif kind == "tool_use":
            use = _validate(_ToolUseBlock, block, f"{path}.{j}")
            calls.append(
                {
                    "id": use.id,
                    "type": "function",
                    "function": {"name": use.name, "arguments": use.input},
                }
            )
        else:
            raise _unsupported(kind, f"{path}.{j}")
    item: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if thoughts:
        item["reasoning_content"] = "\n".join(thoughts)
    if calls:
        item["tool_calls"] = calls
    return item


def from_anthropic(
    system: str | list[dict[str, Any]] | None, messages: list[AnthropicMessage]
) -> list[dict]:
    """Anthropic ``system`` + ``messages`` → template messages.

    ``tool_result`` blocks become ``tool`` messages (in block order; the turn's text blocks
    follow them as one user message, even when sent before them; an image/document inside a tool
    result becomes a placeholder line);
    ``thinking`` becomes ``reasoning_content``; ``redacted_thinking`` is dropped; ``tool_use``
    becomes ``tool_calls``; a ``system`` turn inside ``messages`` stays in place; consecutive
    user turns stay separate.

    Raises:
        APIError: 400 for image/document blocks or unknown block types, naming the block path.
    """
    out = anthropic_system(system)
    for i, msg in enumerate(messages):
        path = f"messages.{i}.content"
        role: Literal["user", "assistant", "system"] = msg.role
        if role == "system":
            out.append({"role": "system", "content": text_of(msg.content, path)})
        elif role == "user":
            out.extend(_user_turn(msg.content, path))
        else:
            out.append(_assistant_turn(msg.content, path))
    return out
