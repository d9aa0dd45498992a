"""OpenClaw (embedded "pi" agent runner): shared/research/harnesses.md §1 and real-clients.md §5
(2026.9.6 observed against a local server).

Detection: the ``<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>`` user message OpenClaw appends to every
request (0.97), a system prompt saying it runs "inside OpenClaw" (0.8), or three or more of its
distinctive tool names (0.7). Its HTTP headers (``OpenAI/JS``, ``undici``) are not its own.
OpenClaw sends no version; the session is the ``session=`` field of the ``Runtime:`` line it
writes into user messages.

Default edits (custom provider on ``openai-completions``, model entry without
``reasoning: true``): E1 strips the reasoning of earlier assistant messages on every request,
including the one just generated from the second tool step of a turn on, so its first changed
token sits right after the ``<think>`` of the previous generation (``thinking_start``).
OpenClaw 2026.9 also moves its trailing internal-context user message behind the new tool
results on every request (E10); that earlier change is covered by ``turn_start``, and E1 still
matters for builds without it (the 2026-04 captures of shared/traces W4).
"""

from __future__ import annotations

import re

from freetoken.prefix.anchors import AnchorKind
from harness_adapters import shapes
from harness_adapters.base import COMMON_BOUNDARIES, EditBoundary, HarnessAdapter, RequestInfo
from harness_adapters.history import (
    check_count, check_messages, compaction_head, tail_start, text, with_content,
)

INTERNAL_CONTEXT_MARKER = "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>"
OMITTED_REASONING = "[assistant reasoning omitted]"
CLEARED_TOOL_RESULT = "[Old tool result content cleared]"
TRIM_NOTE = "[Tool result trimmed: kept first {head} chars and last {tail} chars of {total} chars.]"
SUMMARY_TEXT = ("The conversation history before this point was compacted into the following "
                "summary:\n\n<summary>\n{summary}\n</summary>")
# Tool names only OpenClaw declares (2026.9.6 and the 2026-04 captures of shared/traces W4).
OPENCLAW_TOOLS = frozenset({
    "sessions_yield", "sessions_spawn", "sessions_send", "sessions_list", "sessions_history",
    "session_status", "tool_search", "tool_describe", "agents_list", "memory_search",
    "memory_get", "subagents", "canvas", "nodes", "gateway",
})
SOFT_TRIM_MAX_CHARS = 4000
SOFT_TRIM_HEAD = 1500
SOFT_TRIM_TAIL = 1500
_SESSION_VALUE = re.compile(r"session=([^\s|]{1,200})")
_RUNTIME_LINE_CHARS = 2000  # a Runtime line is ~100 chars; longer text is not one


def runtime_session(piece: str) -> str | None:
    """The ``session=`` value of the first ``Runtime:`` line of ``piece`` that has one. Linear
    time: each line is scanned once, and only its first ``_RUNTIME_LINE_CHARS`` characters."""
    start = piece.find("Runtime: ")
    while start != -1:
        end = piece.find("\n", start)
        line = piece[start:end if end != -1 else len(piece)][:_RUNTIME_LINE_CHARS]
        for match in _SESSION_VALUE.finditer(line):
            if match.start() == 0 or not line[match.start() - 1].isalnum():
                return match.group(1)
        if end == -1:
            return None
        start = piece.find("Runtime: ", end)
    return None


def _is_internal_context(msg: dict) -> bool:
    return msg.get("role") == "user" and text(msg).startswith(INTERNAL_CONTEXT_MARKER)


def strip_reasoning_openclaw(messages: list[dict]) -> list[dict]:
    """E1 ``dropReasoningFromHistory`` (§1b): ``reasoning_content`` is removed from every
    assistant message except the first assistant message after the latest user message, when
    that one has tool calls and is followed by a tool message. A message left with no content,
    no tool calls and no reasoning gets the content ``[assistant reasoning omitted]``.

    OpenClaw's trailing internal-context user message is not a user query and does not count as
    the latest user message (an assumption: the source read does not say where it is inserted
    relative to this policy).

    Raises:
        TypeError: ``messages`` is not a list of dicts.
    """
    check_messages(messages)
    last_user = max((i for i, m in enumerate(messages)
                     if m.get("role") == "user" and not _is_internal_context(m)), default=-1)
    keep = next((i for i in range(last_user + 1, len(messages))
                 if messages[i].get("role") == "assistant"), None)
    if keep is not None and not (messages[keep].get("tool_calls") and keep + 1 < len(messages)
                                 and messages[keep + 1].get("role") == "tool"):
        keep = None
    out = []
    for i, msg in enumerate(messages):
        if msg.get("role") == "assistant" and i != keep and msg.get("reasoning_content"):
            msg = {k: v for k, v in msg.items() if k != "reasoning_content"}
            if not msg.get("content") and not msg.get("tool_calls"):
                msg["content"] = OMITTED_REASONING
        out.append(msg)
    return out


def move_runtime_context(messages: list[dict]) -> list[dict]:
    """E10 runtime context (§1b; observed in real-clients.md §5): OpenClaw sends its
    ``<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>`` user message last and, on the next request, again
    last, after the new tool results; the earlier copy is gone. So every internal-context
    message but a final one is removed (the caller appends the new one, whose text OpenClaw
    regenerates).

    Raises:
        TypeError: ``messages`` is not a list of dicts.
    """
    check_messages(messages)
    last = len(messages) - 1
    return [m for i, m in enumerate(messages) if i == last or not _is_internal_context(m)]


def prune_tool_results(messages: list[dict], *, soft_trim: bool = False, hard_clear: int = 0,
                       keep_last_assistants: int = 3) -> list[dict]:
    """E4/E5 context pruning, ``mode: "cache-ttl"`` (§1b; off by default for non-Anthropic
    providers, and only after the 5-minute TTL with the context estimate over 30% / 50%).

    Prunable: tool messages after the first user message and before the
    ``keep_last_assistants``-th assistant message from the end. The ``hard_clear`` oldest of
    them become ``[Old tool result content cleared]`` (E5); with ``soft_trim`` the others over
    4000 characters keep their first and last 1500 characters around ``\\n...\\n``, followed by
    ``\\n\\n[Tool result trimmed: kept first 1500 chars and last 1500 chars of N chars.]`` (E4).

    Raises:
        TypeError / ValueError: bad ``messages`` or a negative count.
    """
    check_messages(messages)
    hard_clear = check_count(hard_clear, "hard_clear")
    keep_last_assistants = check_count(keep_last_assistants, "keep_last_assistants", 1)
    first_user = next((i for i, m in enumerate(messages) if m.get("role") == "user"), None)
    assistants = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if first_user is None or len(assistants) < keep_last_assistants:
        return list(messages)
    cutoff = assistants[-keep_last_assistants]
    prunable = [i for i in range(first_user + 1, cutoff) if messages[i].get("role") == "tool"]
    cleared = set(prunable[:hard_clear])
    out = list(messages)
    for i in prunable:
        body = text(messages[i])
        if i in cleared:
            out[i] = with_content(messages[i], CLEARED_TOOL_RESULT)
        elif soft_trim and len(body) > SOFT_TRIM_MAX_CHARS:
            note = TRIM_NOTE.format(head=SOFT_TRIM_HEAD, tail=SOFT_TRIM_TAIL, total=len(body))
            trimmed = f"{body[:SOFT_TRIM_HEAD]}\n...\n{body[-SOFT_TRIM_TAIL:]}\n\n{note}"
            out[i] = with_content(messages[i], trimmed)
    return out


def compact(messages: list[dict], summary: str, keep_recent: int = 0) -> list[dict]:
    """E9 compaction (§1b): the messages after the system prompt and before the last
    ``keep_recent`` (the cut moved back so a tool call keeps its results) become one user
    message: ``The conversation history before this point was compacted into the following
    summary:\\n\\n<summary>\\n{summary}\\n</summary>`` (pi-coding-agent's default text).

    Raises:
        TypeError / ValueError: bad ``messages``, an empty summary or a negative count.
    """
    head = compaction_head(messages, summary)
    start = tail_start(messages, check_count(keep_recent, "keep_recent"), head)
    return (messages[:head] + [{"role": "user", "content": SUMMARY_TEXT.format(summary=summary)}]
            + messages[start:])


class OpenClawAdapter(HarnessAdapter):
    """OpenClaw on ``openai-completions`` (its default for a custom ``baseUrl``) or
    ``anthropic-messages``."""

    name = "openclaw"
    title = "OpenClaw"
    boundaries = COMMON_BOUNDARIES + (
        EditBoundary("E1", "reasoning of every assistant message but the current turn's first "
                     "tool step (dropReasoningFromHistory; off with reasoning: true)",
                     AnchorKind.THINKING_START, True),
        EditBoundary("E2", "thinking of all assistant messages but the latest (dropThinkingBlocks; "
                     "old Claude model ids only)", AnchorKind.THINKING_START, False),
        EditBoundary("E3", "thinking blocks with a blank signature (anthropic-messages replay; "
                     "FreeToken signs its blocks)", AnchorKind.THINKING_START, False),
        EditBoundary("E4", "soft-trim of old tool results (cache-ttl pruning, opt-in)",
                     AnchorKind.TOOL_OUTPUT_START, False),
        EditBoundary("E5", "hard-clear of old tool results (cache-ttl pruning, opt-in)",
                     AnchorKind.TOOL_OUTPUT_START, False),
        EditBoundary("E6", "old image/media blocks (none with a text-only model entry)",
                     AnchorKind.TOOL_OUTPUT_START, False),
        EditBoundary("E7", "single oversized tool result truncated when first sent (stable)",
                     AnchorKind.TOOL_OUTPUT_START, False),
        EditBoundary("E8", "overflow recovery: oversized tool results truncated in the session",
                     AnchorKind.TOOL_OUTPUT_START, True),
        EditBoundary("E9", "compaction: messages after the system prompt replaced by a summary",
                     AnchorKind.TURN_START, True),
        EditBoundary("E10", "trailing internal-context user message removed and re-appended "
                     "after the new tool results", AnchorKind.TURN_START, True),
    )

    def detect(self, info: RequestInfo) -> float:
        """See the module docstring for the signals and their confidences."""
        if shapes.any_contains(shapes.last_texts(info, 3) + shapes.first_user_texts(info, 2),
                               INTERNAL_CONTEXT_MARKER):
            return 0.97
        if shapes.any_contains(shapes.system_texts(info), "inside OpenClaw"):
            return 0.8
        if len(shapes.tool_names(info) & OPENCLAW_TOOLS) >= 3:
            return 0.7
        return 0.0

    def session_key(self, info: RequestInfo) -> str | None:
        """The ``session=`` value of a ``Runtime: agent=... | session=... | ...`` line in a user
        message (real-clients.md §5): the latest of the last 8 user messages that has one, else
        the first of the first 4; None when neither has. Bounded so that it stays cheap on long
        histories."""
        users = [m for m in shapes.messages(info) if shapes.role_of(m) == "user"]
        for msg in users[::-1][:8] + users[:4]:
            for piece in shapes.content_texts(msg.get("content")):
                found = runtime_session(piece)
                if found:
                    return found
        return None

    def simulate_edits(self, messages: list[dict], *, drop_reasoning: bool = True,
                       runtime_context: bool = True, soft_trim: bool = False, hard_clear: int = 0,
                       keep_last_assistants: int = 3, summary: str | None = None,
                       keep_recent: int = 0) -> list[dict]:
        """OpenClaw's next history: E9 compaction (persistent) first, then the request-time
        views E10, E4/E5 and E1.

        Args:
            messages: template-form history (not modified).
            drop_reasoning: E1 (§1b), :func:`strip_reasoning_openclaw`; on unless the model
                entry has ``reasoning: true``.
            runtime_context: E10, :func:`move_runtime_context`.
            soft_trim, hard_clear, keep_last_assistants: E4/E5 (§1b), :func:`prune_tool_results`.
            summary, keep_recent: E9 (§1b), :func:`compact` when ``summary`` is given.

        Raises:
            TypeError / ValueError: bad ``messages`` or options.
        """
        check_messages(messages)
        out = list(messages)
        if summary is not None:
            out = compact(out, summary, keep_recent)
        if runtime_context:
            out = move_runtime_context(out)
        if soft_trim or hard_clear:
            out = prune_tool_results(out, soft_trim=soft_trim, hard_clear=hard_clear,
                                     keep_last_assistants=keep_last_assistants)
        if drop_reasoning:
            out = strip_reasoning_openclaw(out)
        return out
