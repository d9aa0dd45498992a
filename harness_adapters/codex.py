"""Codex CLI (openai/codex, Rust; Responses API only), 0.171.0 observed against a local server.

Detection: the ``originator`` header (``codex_exec`` for ``codex exec``, ``codex_cli_rs`` for the
TUI, ``codex_vscode``...; 0.97), a ``User-Agent`` of the same product (``codex_exec/0.171.0
(Debian 12.0.0; x86_64) ...``; 0.95), its ``x-codex-turn-metadata`` / ``x-codex-window-id``
headers (0.9), the base prompt's "running in the Codex CLI" in the instructions or a leading
developer message (0.6), or its shell tool pair ``exec_command`` + ``write_stdin`` (0.5).
Session key: the ``session-id`` header (the thread id; ``thread-id`` and the body's
``prompt_cache_key`` carry the same value), in that order.

What a request looks like: no ``instructions``; the base prompt, permission and skill notes as
``developer`` messages, then an ``<environment_context>`` user message (cwd, shell, date), then
the user's text. ``store: false`` with ``include: ["reasoning.encrypted_content"]``: Codex keeps
the whole history itself and re-sends it on every request, each output item echoed as it
arrived (reasoning summaries included), so steady turns are append-only.

How Codex rewrites its own history (read from the public source of codex-rs/core: the
compaction task, the context manager's history and its normalisation, the output-truncation
helpers; summarised here, not quoted):

* X1 auto-compaction. Once the reported token usage passes ``model_auto_compact_token_limit``
  (the launch sets it to the context less the output cap), Codex sends its history plus a
  summarisation request as one more user message, takes the reply's text as the summary, and
  replaces the history with: the initial context rebuilt (developer messages and environment
  context), the user's own earlier messages (newest first, about 20k estimated tokens, the one
  that overflows cut in the middle, older ones dropped; earlier summaries and context messages
  are not counted as user messages), then one user message holding a fixed prefix line and
  the summary. Everything after the initial context changes: ``turn_start``. For OpenAI's own
  provider Codex compacts server-side instead (``/responses/compact``); a custom provider such
  as FreeToken always gets the local form.
* X2 manual ``/compact``: the same replacement, on request.
* X3 tool output truncation: a function or custom tool result longer than the model's budget
  is cut in the middle (a marker counts what was removed) when it is recorded, before it is
  first sent, so it never moves.
* X4 overflow trimming: when a compaction request itself is over the context window, Codex
  removes the oldest history item (with the call or output paired with it) and retries, which
  edits the very start of the history: ``turn_start``.
* X5 rollback (``/undo``, thread rollback) drops the last user turns: the next prompt is a
  prefix of one already served, no recompute (opt-in, user action).
* X6 after an interruption, a call left without an output gets a synthetic "aborted" output
  and an output whose call is gone is removed (tool output block).

Codex estimates tokens as bytes / 4 (rounded up) for all of this.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from freetoken.prefix.anchors import AnchorKind
from harness_adapters.base import (
    COMMON_BOUNDARIES, EditBoundary, HarnessAdapter, RequestInfo, Version, parse_version,
)
from harness_adapters.history import check_count, check_messages, check_summary, text

BASE_PROMPT_MARK = "running in the Codex CLI"
COMPACT_USER_TOKENS = 20_000
# User messages Codex writes itself as context (not the user's words): rebuilt, never summarised.
CONTEXT_PREFIXES = ("<environment_context>", "<user_instructions>", "# AGENTS.md instructions",
                    "<skill>", "<user_shell_command>", "<turn_aborted>")
SHELL_TOOLS = frozenset({"exec_command", "write_stdin"})
_PRODUCT = re.compile(r"(?:^|[\s(;])(codex_[a-z_]+)/(\d+(?:\.\d+)*)", re.I)


def estimate_tokens(value: str) -> int:
    """Codex's estimate: UTF-8 bytes / 4, rounded up."""
    return -(-len(value.encode("utf-8")) // 4)


def is_context_message(msg: Mapping[str, Any]) -> bool:
    """A user message Codex wrote as context (environment, instructions...), not the user."""
    return msg.get("role") == "user" and text(msg).lstrip().startswith(CONTEXT_PREFIXES)


def initial_context_end(messages: list[dict]) -> int:
    """Index after the initial context: leading system (developer) messages and the context
    user messages right after them, in any order."""
    n = 0
    while n < len(messages) and (messages[n].get("role") == "system"
                                 or is_context_message(messages[n])):
        n += 1
    return n


def _truncate_middle(value: str, tokens: int, count_tokens: Callable[[str], int]) -> str:
    """``value`` cut to about ``tokens`` estimated tokens, keeping its head and tail around a
    marker with the number of tokens removed."""
    removed = count_tokens(value) - tokens
    keep = max(0, tokens * 4 // 2)
    return f"{value[:keep]}…{removed} tokens truncated…{value[len(value) - keep:]}"


def compact(messages: list[dict], summary: str, *, user_tokens: int = COMPACT_USER_TOKENS,
            summary_prefix: str | None = None,
            count_tokens: Callable[[str], int] = estimate_tokens) -> list[dict]:
    """X1/X2 compaction: the initial context, the newest user messages within ``user_tokens``
    (the first that does not fit is cut in the middle, older ones dropped), then a user
    message ``summary`` (the caller passes Codex's prefix line and the summary as one text).

    ``summary_prefix``: text earlier summary messages start with; they are not kept as user
    messages (None: no message is taken for a summary).

    Raises:
        TypeError / ValueError: bad ``messages``, an empty summary or a negative budget.
    """
    check_messages(messages)
    if summary is None:
        raise TypeError("compact needs a summary string, got None")
    check_summary(summary)
    budget = check_count(user_tokens, "user_tokens")
    head = initial_context_end(messages)
    users = [text(m) for m in messages[head:]
             if m.get("role") == "user" and not is_context_message(m)
             and not (summary_prefix and text(m).startswith(summary_prefix))]
    kept: list[str] = []
    for value in reversed(users):
        if budget == 0:
            break
        cost = count_tokens(value)
        if cost <= budget:
            kept.append(value)
            budget -= cost
        else:
            kept.append(_truncate_middle(value, budget, count_tokens))
            break
    return (messages[:head] + [{"role": "user", "content": v} for v in reversed(kept)]
            + [{"role": "user", "content": summary}])


def _leading_instructions(info: RequestInfo) -> list[str]:
    """The ``instructions`` and the texts of the leading developer/system input messages."""
    out = [info.body["instructions"]] if isinstance(info.body.get("instructions"), str) else []
    items = info.body.get("input")
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, Mapping) or item.get("role") not in ("developer", "system"):
            break
        content = item.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out += [p["text"] for p in content
                    if isinstance(p, Mapping) and isinstance(p.get("text"), str)]
    return out


def _function_names(info: RequestInfo) -> frozenset[str]:
    tools = info.body.get("tools")
    return frozenset(t["name"] for t in tools if isinstance(t, Mapping)
                     and t.get("type") == "function" and isinstance(t.get("name"), str)) \
        if isinstance(tools, list) else frozenset()


class CodexAdapter(HarnessAdapter):
    """Codex CLI through its custom model provider (``wire_api = "responses"``)."""

    name = "codex"
    title = "Codex CLI"
    boundaries = COMMON_BOUNDARIES + (
        EditBoundary("X1", "auto-compaction: history after the initial context replaced by "
                     "recent user messages and a summary", AnchorKind.TURN_START, True),
        EditBoundary("X2", "manual /compact, as X1", AnchorKind.TURN_START, True),
        EditBoundary("X3", "long tool output cut in the middle when recorded (fixed when first "
                     "sent)", AnchorKind.TOOL_OUTPUT_START, False),
        EditBoundary("X4", "oldest history item dropped when a compaction request overflows",
                     AnchorKind.TURN_START, True),
        EditBoundary("X5", "rollback / undo drops the last user turns (a prefix of a served "
                     "prompt)", AnchorKind.TURN_START, False),
        EditBoundary("X6", "interrupted call gets a synthetic aborted output; orphan outputs "
                     "removed", AnchorKind.TOOL_OUTPUT_START, False),
    )

    def detect(self, info: RequestInfo) -> float:
        """See the module docstring for the signals and their confidences."""
        if info.header("originator").lower().startswith("codex_"):
            return 0.97
        if _PRODUCT.search(info.header("user-agent")):
            return 0.95
        if info.header("x-codex-turn-metadata") or info.header("x-codex-window-id"):
            return 0.9
        if any(BASE_PROMPT_MARK in t for t in _leading_instructions(info)):
            return 0.6
        if SHELL_TOOLS <= _function_names(info):
            return 0.5
        return 0.0

    def version(self, info: RequestInfo) -> Version | None:
        """From ``User-Agent: codex_exec/0.171.0 (...)`` (any ``codex_*`` product)."""
        match = _PRODUCT.search(info.header("user-agent"))
        return parse_version(match.group(2)) if match else None

    def session_key(self, info: RequestInfo) -> str | None:
        """The ``session-id`` header, else ``thread-id``, else the body's ``prompt_cache_key``."""
        for name in ("session-id", "thread-id"):
            if info.header(name).strip():
                return info.header(name).strip()
        key = info.body.get("prompt_cache_key")
        return key.strip() or None if isinstance(key, str) else None

    def simulate_edits(self, messages: list[dict], *, summary: str | None = None,
                       user_tokens: int = COMPACT_USER_TOKENS, summary_prefix: str | None = None,
                       count_tokens: Callable[[str], int] = estimate_tokens) -> list[dict]:
        """Codex's next history: X1 compaction when ``summary`` is given (see :func:`compact`),
        else append-only (a copy).

        Raises:
            TypeError / ValueError: bad ``messages`` or options.
        """
        check_messages(messages)
        check_summary(summary)
        if summary is None:
            return list(messages)
        return compact(messages, summary, user_tokens=user_tokens, summary_prefix=summary_prefix,
                       count_tokens=count_tokens)
