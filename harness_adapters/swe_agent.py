"""SWE-agent (SWE-agent/SWE-agent, through litellm, non-streaming): shared/research/harnesses.md §3.

Detection: ``User-Agent: swe-agent/<ver>`` (its ``extra_headers``; 0.95), the classic system
prompt ``SETTING: You are an autonomous programmer...`` (0.8), or the ``str_replace_editor`` +
``submit`` tools (0.7). No session id.

Edits: history processors run on every query. S1 ``last_n_observations`` (n: 5 in
``config/sweagent_0_7/07.yaml`` and ``coding_challenge.yaml``; the shipped ``default.yaml`` uses
only ``cache_control``) replaces the observation that slid out of the window, a tool message in
function-calling mode, so its first changed token follows a ``<tool_response>``. S1 is declared
default-on because the configurations that use it are the common benchmark ones.
"""

from __future__ import annotations

from freetoken.prefix.anchors import AnchorKind
from harness_adapters import shapes
from harness_adapters.base import (
    COMMON_BOUNDARIES, EditBoundary, HarnessAdapter, RequestInfo, Version, agent_version,
)
from harness_adapters.history import check_count, check_messages, text, with_content

ELIDED_OBSERVATION = "Old environment output: ({n} lines omitted)"
_SETTING = "SETTING: You are an autonomous programmer"
_SWE_AGENT_TOOLS = frozenset({"str_replace_editor", "submit"})


def observation_indices(messages: list[dict]) -> list[int]:
    """Indices of SWE-agent observations in a template-form history.

    The first observation is the instance template: the last user message before the first
    assistant message (earlier user messages are demonstrations). Every ``user`` or ``tool``
    message after the first assistant message is an environment observation. A history without
    an assistant message has only the instance template.

    Raises:
        TypeError: ``messages`` is not a list of dicts.
    """
    check_messages(messages)
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
    head = [i for i in range(first) if messages[i].get("role") == "user"][-1:]
    return head + [i for i in range(first + 1, len(messages))
                   if messages[i].get("role") in ("user", "tool")]


def elide_old_observations(messages: list[dict], keep_last: int = 5, polling: int = 1) -> list[dict]:
    """S1 ``last_n_observations`` (§3b): every observation but the first (the instance
    template) and the last ``keep_last`` gets the content ``Old environment output: (N lines
    omitted)``, N = number of lines of the original content. With ``polling`` k the window only
    moves every k observations: the elided ones are those before
    ``(count // k) * k - keep_last``, so between ``keep_last`` and ``keep_last + k - 1``
    observations stay.

    Raises:
        TypeError: bad ``messages`` or counts. ValueError: ``keep_last < 1`` or ``polling < 1``.
    """
    keep_last = check_count(keep_last, "keep_last", 1)
    polling = check_count(polling, "polling", 1)
    obs = observation_indices(messages)
    end = max(0, (len(obs) // polling) * polling - keep_last)
    drop = set(obs[1:end])
    return [with_content(m, ELIDED_OBSERVATION.format(n=len(text(m).splitlines())))
            if i in drop else m for i, m in enumerate(messages)]


class SWEAgentAdapter(HarnessAdapter):
    """SWE-agent 1.x (function calling by default)."""

    name = "swe_agent"
    title = "SWE-agent"
    boundaries = COMMON_BOUNDARIES + (
        EditBoundary("S1", "observations outside the last n replaced by 'Old environment output' "
                     "(last_n_observations)", AnchorKind.TOOL_OUTPUT_START, True),
        EditBoundary("S2", "older file-viewer windows in user observations (closed_window, opt-in)",
                     AnchorKind.TURN_START, False),
        EditBoundary("S3", "regex matches removed from older messages (remove_regex, opt-in)",
                     AnchorKind.TURN_START, False),
        EditBoundary("S4", "cache_control markers moved; string content becomes one text part",
                     AnchorKind.TURN_START, True),
        EditBoundary("S5", "format-error requery: the failed output and error message dropped",
                     AnchorKind.GENERATION_START, True),
    )

    def detect(self, info: RequestInfo) -> float:
        """See the module docstring for the signals and their confidences."""
        if agent_version(info.header("user-agent"), "swe-agent") is not None:
            return 0.95
        if any(t.startswith(_SETTING) for t in shapes.system_texts(info)):
            return 0.8
        if _SWE_AGENT_TOOLS <= shapes.tool_names(info):
            return 0.7
        return 0.0

    def version(self, info: RequestInfo) -> Version | None:
        """From ``User-Agent: swe-agent/1.1.0``."""
        return agent_version(info.header("user-agent"), "swe-agent")

    def simulate_edits(self, messages: list[dict], *, n: int | None = 5,
                       polling: int = 1) -> list[dict]:
        """SWE-agent's next history under ``last_n_observations`` (S1, §3b).

        Args:
            messages: template-form history (not modified).
            n: observations kept (besides the instance template); None: no elision (the
                ``default`` processor).
            polling: see :func:`elide_old_observations`.

        Raises:
            TypeError / ValueError: bad ``messages`` or options.
        """
        check_messages(messages)
        if n is None:
            return list(messages)
        return elide_old_observations(messages, n, polling)
