"""Claude Code (closed source; Anthropic Messages only): shared/research/harnesses.md §5 and
real-clients.md §3 (CLI 2.1.197 observed against a local server).

Detection: the attribution line ``x-anthropic-billing-header: cc_version=...;`` at the top of the
system prompt (1.0: no other client writes it), ``User-Agent: claude-cli/<ver> (...)`` (0.95),
an ``X-Claude-Code-Session-Id`` header or a ``claude-code-*`` ``anthropic-beta`` value (0.9),
``x-app: cli`` on the Anthropic API (0.5).

Normalisation removes the attribution line (C1): it carries a per-request nonce (``cch=``) and a
per-session version suffix, so it changes the first prompt tokens on every request or session.
System-role messages inside ``messages`` (C4) stay where they are: they are append-only as long
as nobody hoists them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from freetoken.prefix.anchors import AnchorKind
from harness_adapters import shapes
from harness_adapters.base import (
    COMMON_BOUNDARIES, EditBoundary, HarnessAdapter, RequestInfo, Version, agent_version,
    parse_version,
)
from harness_adapters.history import (
    check_count, check_messages, check_summary, leading_system, tool_names, with_content,
)

# Same text as freetoken.server.messages.BILLING_HEADER_PREFIX (not imported: the server package
# imports this one).
BILLING_HEADER_PREFIX = "x-anthropic-billing-header:"
CLEARED_TOOL_RESULT = "[Old tool result content cleared]"
# Tools whose results time-based microcompact may clear (harnesses.md §5b C5).
COMPACTABLE_TOOLS = frozenset({"Read", "Bash", "Grep", "Glob", "WebSearch", "WebFetch", "Edit",
                               "Write"})
_CC_VERSION = re.compile(r"cc_version=([0-9][0-9.]*)")
_LEGACY_SESSION = re.compile(r"_session_([0-9A-Za-z-]{8,})")


def strip_attribution_line(system: str | list[dict[str, Any]] | None
                           ) -> str | list[dict[str, Any]] | None:
    """The Anthropic wire ``system`` value without the attribution (billing) line (C1).

    Args:
        system: a string (lines starting with ``x-anthropic-billing-header:`` are removed), a
            list of blocks (text blocks whose text starts with it are removed), or None.

    Returns:
        The same kind of value; ``system`` itself when there is no such line.

    Raises:
        TypeError: ``system`` is neither None, a string nor a list.
    """
    if system is None:
        return None
    if isinstance(system, str):
        lines = system.split("\n")
        kept = [line for line in lines if not line.startswith(BILLING_HEADER_PREFIX)]
        return system if len(kept) == len(lines) else "\n".join(kept)
    if isinstance(system, list):
        return [b for b in system
                if not (isinstance(b, dict) and b.get("type") == "text"
                        and str(b.get("text", "")).startswith(BILLING_HEADER_PREFIX))]
    raise TypeError(f"system must be None, a string or a list of blocks, got {type(system).__name__}")


def _billing_line(info: RequestInfo) -> str:
    for text in shapes.system_texts(info):
        if text.startswith(BILLING_HEADER_PREFIX):
            return text.partition("\n")[0]
    return ""


class ClaudeCodeAdapter(HarnessAdapter):
    """Claude Code (``claude`` CLI and its sub-agents)."""

    name = "claude_code"
    title = "Claude Code"
    boundaries = COMMON_BOUNDARIES + (
        EditBoundary("C1", "attribution line x-anthropic-billing-header (cch nonce) at the top of "
                     "the system prompt, regenerated per request", AnchorKind.TURN_START, True,
                     since=(2, 1, 36)),
        EditBoundary("C2", "auto-compaction: all messages replaced by a summary user message",
                     AnchorKind.TURN_START, True),
        EditBoundary("C3", "earlier thinking cleared (context_management thinking_turns), applied "
                     "by the server, which FreeToken does not", AnchorKind.THINKING_START, False),
        EditBoundary("C4", "system-role messages inside messages (<total_tokens>, agent registry); "
                     "append-only when rendered in place", AnchorKind.TURN_START, True,
                     since=(2, 1, 154)),
        EditBoundary("C5", "time-based microcompact: old tool results cleared (GrowthBook-gated, "
                     "off by default)", AnchorKind.TOOL_OUTPUT_START, False),
        EditBoundary("C6", "cached microcompact cache_edits (first-party API only)",
                     AnchorKind.TOOL_OUTPUT_START, False),
        EditBoundary("C7", "large tool result replaced by a preview when created (stable)",
                     AnchorKind.TOOL_OUTPUT_START, False),
        EditBoundary("C8", "date / git status in the system prompt or first user context",
                     AnchorKind.TURN_START, True),
    )

    def detect(self, info: RequestInfo) -> float:
        """See the module docstring for the signals and their confidences."""
        if _billing_line(info):
            return 1.0
        if agent_version(info.header("user-agent"), "claude-cli") is not None:
            return 0.95
        if info.header("x-claude-code-session-id") or "claude-code-" in info.header("anthropic-beta"):
            return 0.9
        if info.api == "anthropic" and info.header("x-app").strip().lower() == "cli":
            return 0.5
        return 0.0

    def version(self, info: RequestInfo) -> Version | None:
        """From ``User-Agent: claude-cli/2.1.197 (...)``, else the attribution line's
        ``cc_version=2.1.197.<hex>`` (first three components)."""
        found = agent_version(info.header("user-agent"), "claude-cli")
        if found is not None:
            return found
        match = _CC_VERSION.search(_billing_line(info))
        return parse_version(match.group(1), parts=3) if match else None

    def session_key(self, info: RequestInfo) -> str | None:
        """``X-Claude-Code-Session-Id``, else the ``session_id`` inside ``metadata.user_id``
        (a JSON-encoded string in 2.1.x; ``user_<hash>_account__session_<uuid>`` earlier)."""
        header = info.header("x-claude-code-session-id").strip()
        if header:
            return header
        metadata = info.body.get("metadata")
        user_id = metadata.get("user_id") if isinstance(metadata, Mapping) else None
        if not isinstance(user_id, str):
            return None
        try:
            decoded = json.loads(user_id)
        except ValueError:
            decoded = None
        if isinstance(decoded, Mapping) and isinstance(decoded.get("session_id"), str) \
                and decoded["session_id"]:
            return decoded["session_id"]
        match = _LEGACY_SESSION.search(user_id)
        return match.group(1) if match else None

    def normalize(self, messages: list[dict]) -> list[dict]:
        """Remove the attribution line from the top of the first (system) message (C1).

        Only that line and its newline go; the rest of the message is kept byte for byte. A
        system message that held nothing else is dropped, as the server did when it removed the
        attribution block itself. Cost: O(1) when there is nothing to remove (``messages`` is
        returned), else one list copy of references.

        Raises:
            TypeError: ``messages`` is not a list.
        """
        messages = super().normalize(messages)
        first = messages[0] if messages else None
        if not isinstance(first, Mapping) or first.get("role") != "system":
            return messages
        content = first.get("content")
        if not isinstance(content, str) or not content.startswith(BILLING_HEADER_PREFIX):
            return messages
        rest = content.partition("\n")[2]
        return ([with_content(first, rest)] if rest else []) + messages[1:]

    def simulate_edits(self, messages: list[dict], *, summary: str | None = None,
                       keep_thinking_turns: int | None = None,
                       clear_tool_results: bool = False, keep_tool_results: int = 5,
                       compactable_tools: Iterable[str] = COMPACTABLE_TOOLS) -> list[dict]:
        """Claude Code's next history under the given edits, applied in this order.

        Args:
            messages: template-form history (not modified).
            summary: C2 compaction (§5b): when given, every message after the leading system
                messages is replaced by one user message with this text (the summary wording is
                Claude Code's own and not verified, so the caller supplies the full text).
            keep_thinking_turns: C3 (§5b): keep ``reasoning_content`` only on the last this many
                assistant messages that have some (``context_management`` ``thinking_turns``);
                None keeps all (``keep: "all"``, the default).
            clear_tool_results: C5 time-based microcompact (§5b): results of
                ``compactable_tools`` calls, except the most recent ``keep_tool_results`` of
                them, become ``[Old tool result content cleared]``.
            keep_tool_results: see ``clear_tool_results`` (5 in Claude Code).
            compactable_tools: tool names whose results C5 may clear.

        Returns:
            A new list; unchanged messages are shared with the input.

        Raises:
            TypeError: bad ``messages`` or option types. ValueError: an empty summary or a
                negative count.
        """
        check_messages(messages)
        check_summary(summary)
        keep_tool_results = check_count(keep_tool_results, "keep_tool_results")
        out = list(messages)
        if summary is not None:
            out = out[:leading_system(out)] + [{"role": "user", "content": summary}]
        if clear_tool_results:
            out = _clear_tool_results(out, keep_tool_results, frozenset(compactable_tools))
        if keep_thinking_turns is not None:
            out = _clear_thinking(out, check_count(keep_thinking_turns, "keep_thinking_turns"))
        return out


def _clear_tool_results(messages: list[dict], keep: int, compactable: frozenset[str]) -> list[dict]:
    names = tool_names(messages)
    eligible = [i for i, m in enumerate(messages) if m.get("role") == "tool"
                and names.get(str(m.get("tool_call_id") or "")) in compactable]
    clear = set(eligible[:max(0, len(eligible) - keep)])
    return [with_content(m, CLEARED_TOOL_RESULT) if i in clear else m for i, m in enumerate(messages)]


def _clear_thinking(messages: list[dict], keep: int) -> list[dict]:
    thinking = [i for i, m in enumerate(messages)
                if m.get("role") == "assistant" and m.get("reasoning_content")]
    clear = set(thinking[:max(0, len(thinking) - keep)])
    return [{k: v for k, v in m.items() if k != "reasoning_content"} if i in clear else m
            for i, m in enumerate(messages)]
