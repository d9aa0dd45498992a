"""Pure helpers over template-form histories, shared by the edit simulators.

Nothing here modifies its input: a changed message is a new dict, an unchanged one is shared.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def check_messages(messages: object) -> None:
    """Raise unless ``messages`` is a list of dicts.

    Raises:
        TypeError: not a list, or an element that is not a mapping (naming its index).
    """
    if not isinstance(messages, list):
        raise TypeError(f"messages must be a list, got {type(messages).__name__}")
    for i, msg in enumerate(messages):
        if not isinstance(msg, Mapping):
            raise TypeError(f"messages[{i}] must be a dict, got {type(msg).__name__}")


def text(msg: Mapping[str, Any]) -> str:
    """The message's text: ``content`` when a string, text parts joined with ``"\\n"`` when a
    list (as the server joins them), else ``""``."""
    content = msg.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content
                         if isinstance(p, Mapping) and p.get("type", "text") == "text")
    return ""


def with_content(msg: Mapping[str, Any], content: str) -> dict:
    """A copy of ``msg`` with ``content`` replaced."""
    return {**msg, "content": content}


def leading_system(messages: list[dict]) -> int:
    """Number of system messages at the head (the system prompt)."""
    n = 0
    while n < len(messages) and messages[n].get("role") == "system":
        n += 1
    return n


def tool_names(messages: list[dict]) -> dict[str, str]:
    """Tool name of every tool call id in the assistant messages."""
    names: dict[str, str] = {}
    for msg in messages:
        for call in msg.get("tool_calls") or ():
            if isinstance(call, Mapping):
                fn = call.get("function") if isinstance(call.get("function"), Mapping) else {}
                names[str(call.get("id") or "")] = str(fn.get("name") or "")
    return names


def tail_start(messages: list[dict], keep: int, floor: int) -> int:
    """Index where the last ``keep`` messages start, moved back so the kept part never begins
    with a ``tool`` message (a tool call and its results stay together), never below
    ``floor``.

    Raises:
        ValueError: ``keep < 0``.
    """
    if keep < 0:
        raise ValueError(f"the number of kept messages must be >= 0, got {keep}")
    start = max(floor, len(messages) - keep)
    while floor < start < len(messages) and messages[start].get("role") == "tool":
        start -= 1
    return start


def check_summary(summary: object) -> None:
    """Raise unless ``summary`` is None or a non-empty string.

    Raises:
        TypeError: not a string. ValueError: empty.
    """
    if summary is None:
        return
    if not isinstance(summary, str):
        raise TypeError(f"summary must be a string, got {type(summary).__name__}")
    if not summary:
        raise ValueError("summary must not be empty")


def compaction_head(messages: object, summary: object) -> int:
    """Checks shared by the compaction simulators; returns the number of leading system
    messages (they survive a compaction).

    Raises:
        TypeError / ValueError: bad ``messages``, a None or empty summary.
    """
    check_messages(messages)
    if summary is None:
        raise TypeError("compact needs a summary string, got None")
    check_summary(summary)
    return leading_system(messages)


def check_count(value: object, name: str, minimum: int = 0) -> int:
    """``value`` as an int >= ``minimum``.

    Raises:
        TypeError: not an int. ValueError: below ``minimum``.
    """
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value
