"""Read-only views of a raw request body for detection, tolerant of any shape.

Detection runs on every request before validation, on bodies of up to megabytes: these helpers
look only at the few places a harness leaves its marks (the system prompt, the first and last
messages, the tool names) and return empty values instead of raising on unexpected shapes.
Both wire formats are handled: OpenAI chat (system as a message, ``tools[].function.name``,
content a string or a list of parts) and Anthropic Messages (top-level ``system`` string or
text blocks, ``tools[].name``, content a string or a list of blocks).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from harness_adapters.base import RequestInfo


def content_texts(content: Any) -> Iterator[str]:
    """The text pieces of a message content: the string itself, or the ``text`` of each part
    or block (an Anthropic ``tool_result`` block contributes its own content's texts)."""
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if not isinstance(part, Mapping):
                continue
            if isinstance(part.get("text"), str):
                yield part["text"]
            elif part.get("type") == "tool_result":
                yield from content_texts(part.get("content"))


def messages(info: RequestInfo) -> list:
    """The body's ``messages`` list (``[]`` when absent or not a list)."""
    value = info.body.get("messages")
    return value if isinstance(value, list) else []


def role_of(msg: Any) -> str:
    """A message's role (``""`` for a malformed message)."""
    return str(msg.get("role", "")) if isinstance(msg, Mapping) else ""


def system_texts(info: RequestInfo) -> list[str]:
    """Texts of the system prompt: the Anthropic top-level ``system`` (string or blocks, in
    order) and the leading ``system``/``developer`` messages."""
    out = list(content_texts(info.body.get("system")))
    for msg in messages(info):
        if role_of(msg) not in ("system", "developer"):
            break
        out.extend(content_texts(msg.get("content")))
    return out


def first_user_texts(info: RequestInfo, count: int = 2) -> list[str]:
    """Texts of the first ``count`` user messages."""
    out: list[str] = []
    for msg in messages(info):
        if count <= 0:
            break
        if role_of(msg) == "user":
            out.extend(content_texts(msg.get("content")))
            count -= 1
    return out


def last_texts(info: RequestInfo, count: int = 3) -> list[str]:
    """Texts of the last ``count`` messages (any role)."""
    out: list[str] = []
    for msg in messages(info)[-count:]:
        if isinstance(msg, Mapping):
            out.extend(content_texts(msg.get("content")))
    return out


def tools(info: RequestInfo) -> list[Mapping]:
    """The body's tool definitions that are objects."""
    value = info.body.get("tools")
    return [t for t in value if isinstance(t, Mapping)] if isinstance(value, list) else []


def tool_name(tool: Mapping) -> str:
    """Name of a tool definition in either wire format (``""`` when it has none)."""
    fn = tool.get("function")
    if isinstance(fn, Mapping):
        return str(fn.get("name", ""))
    return str(tool.get("name", ""))


def tool_parameters(tool: Mapping) -> Mapping:
    """JSON schema of a tool's parameters in either wire format (``{}`` when missing)."""
    fn = tool.get("function")
    schema = fn.get("parameters") if isinstance(fn, Mapping) else tool.get("input_schema")
    return schema if isinstance(schema, Mapping) else {}


def tool_names(info: RequestInfo) -> frozenset[str]:
    """Names of the declared tools."""
    return frozenset(tool_name(t) for t in tools(info))


def any_contains(texts: list[str], needle: str) -> bool:
    """Whether some text contains ``needle``."""
    return any(needle in t for t in texts)
