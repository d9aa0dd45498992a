"""History edits the agent harnesses apply between model calls, as pure functions.

Used by ``evals/bench_prefix.py`` to replay ../shared/traces the way each harness would have sent
them (issue 5 moves these into ``harness_adapters/``). Each function returns new lists/dicts and
never modifies its input. Sources (shared/research/harnesses.md):

* :func:`strip_attribution_line`: Claude Code's per-request attribution block
  ``x-anthropic-billing-header: cc_version=...; cch=<nonce>;`` at the top of the system prompt
  (§5b C1; CLI >= 2.1.36). The FreeToken server drops it as well
  (``freetoken.server.messages.anthropic_system``).
* :func:`elide_old_observations`: SWE-agent's ``last_n_observations`` history processor (§3b S1;
  ``n: 5`` in ``config/sweagent_0_7/07.yaml``): every observation except the first (the instance
  template) and the last ``n`` is replaced by ``Old environment output: (N lines omitted)``.
* :func:`strip_reasoning_openclaw`: OpenClaw's ``dropReasoningFromHistory`` (§1b E1): reasoning
  is removed from every assistant message except the first one after the latest user message when
  that one made a tool call answered by a tool result; a message left empty becomes
  ``[assistant reasoning omitted]``.

Messages are in the OpenAI-normalised form ``freetoken.chat.template.ChatTemplate`` renders
(``role`` system/user/assistant/tool, ``content`` str, optional ``reasoning_content`` and
``tool_calls``), except :func:`strip_attribution_line`, which works on the Anthropic ``system``
value (a string or a list of text blocks) before conversion.
"""

from __future__ import annotations

from typing import Any

from freetoken.server.messages import BILLING_HEADER_PREFIX

ELIDED_OBSERVATION = "Old environment output: ({n} lines omitted)"
OMITTED_REASONING = "[assistant reasoning omitted]"


def strip_attribution_line(system: str | list[dict[str, Any]] | None
                           ) -> str | list[dict[str, Any]] | None:
    """The Anthropic ``system`` value without Claude Code's attribution (billing) line.

    Args:
        system: a string (lines starting with ``x-anthropic-billing-header:`` are removed) or a
            list of blocks (text blocks whose text starts with it are removed), or None.

    Returns:
        The same kind of value; unchanged when there is no such line.

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
    raise TypeError(
        f"system must be None, a string or a list of blocks, got {type(system).__name__}")


def observation_indices(messages: list[dict]) -> list[int]:
    """Indices of SWE-agent observations in a template-message history.

    The first observation is the instance template (the last user message before the first
    assistant message; earlier user messages are demonstrations); every ``user`` or ``tool``
    message after the first assistant message is an environment observation. A history without
    an assistant message has only the instance template.
    """
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
    users = [i for i in range(first) if messages[i].get("role") == "user"]
    head = users[-1:]
    return head + [i for i in range(first + 1, len(messages))
                   if messages[i].get("role") in ("user", "tool")]


def elide_old_observations(messages: list[dict], keep_last: int = 5) -> list[dict]:
    """SWE-agent ``last_n_observations`` with polling 1: observations outside the last
    ``keep_last`` (except the first) get the content ``Old environment output: (N lines
    omitted)``, N = newlines in the original content.

    Raises:
        ValueError: ``keep_last < 1``.
    """
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    obs = observation_indices(messages)
    drop = set(obs[1:max(0, len(obs) - keep_last)])
    out = []
    for i, msg in enumerate(messages):
        if i in drop:
            msg = dict(msg)
            msg["content"] = ELIDED_OBSERVATION.format(n=str(msg.get("content") or "").count("\n"))
        out.append(msg)
    return out


def strip_reasoning_openclaw(messages: list[dict]) -> list[dict]:
    """OpenClaw E1: drop ``reasoning_content`` of every assistant message except the first
    assistant message after the latest ``user`` message, when that one has tool calls and is
    followed by a ``tool`` message. An assistant message left with no content, no tool calls
    and no reasoning gets the content ``[assistant reasoning omitted]``."""
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
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
