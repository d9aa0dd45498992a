"""OpenCode (anomalyco/opencode, formerly sst/opencode): shared/research/harnesses.md §2 and
real-clients.md §4 (1.18.33 observed against a local server).

Detection: ``User-Agent: opencode/<ver> ai-sdk/... runtime/bun/...`` (0.95), the
``x-session-affinity`` + ``x-session-id`` header pair (0.6), or its lower-case tool set
(``todowrite``, ``webfetch``, ``glob``, ``grep``; 0.6). Session key: ``x-session-id``.

Edits: P2 auto-compaction is on by default and lands on the first message after the system
prompt (``turn_start``); P1 pruning is opt-in (``compaction.prune: true``), so
``tool_output_start`` is not in the default policy. OpenCode keeps reasoning on every assistant
message: thinking drops come from the template (B1) only.

Version note: "compact v2" (June 2026) reportedly ignores ``tail_turns``/``prune``; the first
version carrying it is not documented, so P1/P2 are not version-gated.
"""

from __future__ import annotations

from collections.abc import Callable

from freetoken.prefix.anchors import AnchorKind
from harness_adapters import shapes
from harness_adapters.base import (
    COMMON_BOUNDARIES, EditBoundary, HarnessAdapter, RequestInfo, Version, agent_version,
)
from harness_adapters.history import (
    check_count, check_messages, check_summary, compaction_head, text, tool_names, with_content,
)

CLEARED_TOOL_RESULT = "[Old tool result content cleared]"
COMPACTION_QUESTION = "What did we do so far?"
CONTINUE_MESSAGE = ("Continue if you have next steps, or stop and ask for clarification if you "
                    "are unsure how to proceed.")
PRUNE_PROTECT = 40_000
PRUNE_MINIMUM = 20_000
PROTECTED_TOOLS = frozenset({"skill"})
_OPENCODE_TOOLS = frozenset({"todowrite", "webfetch", "glob", "grep"})


def estimate_tokens(value: str) -> int:
    """OpenCode's token estimate for pruning: characters / 4, rounded (an assumption: the
    estimator is not quoted in harnesses.md; pass ``count_tokens`` to use another)."""
    return round(len(value) / 4)


def prune_tool_outputs(messages: list[dict], *, protect: int = PRUNE_PROTECT,
                       minimum: int = PRUNE_MINIMUM,
                       count_tokens: Callable[[str], int] = estimate_tokens) -> list[dict]:
    """P1 prune (§2b; only with ``compaction.prune: true``).

    Walks back from the end, skipping the last two user turns, and stops at the compaction
    summary or at an already cleared result. Results of ``skill`` calls are never touched. Once
    the newer results add up to more than ``protect`` tokens, every older result is marked; if
    the marked ones hold more than ``minimum`` tokens they become
    ``[Old tool result content cleared]``, else nothing changes.

    Raises:
        TypeError / ValueError: bad ``messages`` or a negative limit.
    """
    check_messages(messages)
    protect = check_count(protect, "prune_protect")
    minimum = check_count(minimum, "prune_minimum")
    names = tool_names(messages)
    total = pruned = turns = 0
    marked: list[int] = []
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        role = msg.get("role")
        turns += role == "user"
        if turns < 2:
            continue
        if role == "assistant" and i > 0 and messages[i - 1].get("role") == "user" \
                and text(messages[i - 1]) == COMPACTION_QUESTION:
            break  # the summary message: everything before it is already compacted
        if role != "tool" or names.get(str(msg.get("tool_call_id") or "")) in PROTECTED_TOOLS:
            continue
        body = text(msg)
        if body == CLEARED_TOOL_RESULT:
            break
        estimate = count_tokens(body)
        total += estimate
        if total > protect:
            pruned += estimate
            marked.append(i)
    if pruned <= minimum:
        return list(messages)
    out = list(messages)
    for i in marked:
        out[i] = with_content(messages[i], CLEARED_TOOL_RESULT)
    return out


def compact(messages: list[dict], summary: str, *, tail_turns: int = 2,
            continue_message: bool = True) -> list[dict]:
    """P2/P3 compaction (§2b): the system prompt, then a user message ``What did we do so
    far?``, an assistant message with ``summary``, the last ``tail_turns`` user turns (all of
    them when there are fewer), and ``Continue if you have next steps, or stop and ask for
    clarification if you are unsure how to proceed.`` as a user message (``continue_message``).
    The token budget of the tail (``preserve_recent_tokens``) is left to the caller's choice of
    ``tail_turns``.

    Raises:
        TypeError / ValueError: bad ``messages``, an empty summary or a negative count.
    """
    head = compaction_head(messages, summary)
    tail_turns = check_count(tail_turns, "tail_turns")
    users = [i for i in range(head, len(messages)) if messages[i].get("role") == "user"]
    if tail_turns == 0:
        start = len(messages)
    else:
        start = users[-tail_turns] if len(users) >= tail_turns else head
    out = messages[:head] + [{"role": "user", "content": COMPACTION_QUESTION},
                             {"role": "assistant", "content": summary}] + messages[start:]
    if continue_message:
        out.append({"role": "user", "content": CONTINUE_MESSAGE})
    return out


class OpenCodeAdapter(HarnessAdapter):
    """OpenCode through ``@ai-sdk/openai-compatible`` (or ``@ai-sdk/anthropic``)."""

    name = "opencode"
    title = "OpenCode"
    boundaries = COMMON_BOUNDARIES + (
        EditBoundary("P1", "old tool outputs cleared (compaction.prune, opt-in)",
                     AnchorKind.TOOL_OUTPUT_START, False),
        EditBoundary("P2", "auto-compaction: history before the tail replaced by a summary",
                     AnchorKind.TURN_START, True),
        EditBoundary("P3", "manual /compact, as P2", AnchorKind.TURN_START, True),
        EditBoundary("P4", "Today's date line in the system prompt (changes at midnight)",
                     AnchorKind.TURN_START, True),
        EditBoundary("P5", "errored assistant message skipped, interrupted tool marked",
                     AnchorKind.GENERATION_START, True),
    )

    def detect(self, info: RequestInfo) -> float:
        """See the module docstring for the signals and their confidences."""
        if agent_version(info.header("user-agent"), "opencode") is not None:
            return 0.95
        if info.header("x-session-affinity") and info.header("x-session-id"):
            return 0.6
        if _OPENCODE_TOOLS <= shapes.tool_names(info):
            return 0.6
        return 0.0

    def version(self, info: RequestInfo) -> Version | None:
        """From ``User-Agent: opencode/1.18.33 ...``."""
        return agent_version(info.header("user-agent"), "opencode")

    def session_key(self, info: RequestInfo) -> str | None:
        """The ``x-session-id`` header, or None."""
        return info.header("x-session-id").strip() or None

    def simulate_edits(self, messages: list[dict], *, summary: str | None = None,
                       tail_turns: int = 2, continue_message: bool = True, prune: bool = False,
                       prune_protect: int = PRUNE_PROTECT, prune_minimum: int = PRUNE_MINIMUM,
                       count_tokens: Callable[[str], int] = estimate_tokens) -> list[dict]:
        """OpenCode's next history: P2 compaction (when ``summary`` is given), then P1 prune.

        Args:
            messages: template-form history (not modified).
            summary, tail_turns, continue_message: P2 (§2b), see :func:`compact`.
            prune, prune_protect, prune_minimum, count_tokens: P1 (§2b, opt-in), see
                :func:`prune_tool_outputs`.

        Raises:
            TypeError / ValueError: bad ``messages`` or options.
        """
        check_messages(messages)
        check_summary(summary)
        out = list(messages)
        if summary is not None:
            out = compact(out, summary, tail_turns=tail_turns, continue_message=continue_message)
        if prune:
            out = prune_tool_outputs(out, protect=prune_protect, minimum=prune_minimum,
                                     count_tokens=count_tokens)
        return out
