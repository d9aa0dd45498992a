"""mini-swe-agent 2.x (SWE-agent/mini-swe-agent, through litellm, non-streaming):
shared/research/harnesses.md §4 and real-clients.md §6 (2.4.6 observed against a local server).

Detection: its instructions name the submit command ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``
or the text protocol's ``mswea_bash_command`` fence (0.85; 0.9 together with the single ``bash``
tool); the single ``bash`` tool whose only parameter is ``command`` alone is a weak sign (0.5).
Its HTTP headers are the openai SDK's (``OpenAI/Python``), no version, no session id.

Edits: none; the history is append-only. A format error discards the generated reply and
appends a user message instead (M1, a tail rollback to the generation start). Optional cache
markers (M2) only turn the last message's string content into one text part.
"""

from __future__ import annotations

from collections.abc import Mapping

from freetoken.prefix.anchors import AnchorKind
from harness_adapters import shapes
from harness_adapters.base import COMMON_BOUNDARIES, EditBoundary, HarnessAdapter, RequestInfo

SUBMIT_COMMAND = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
TEXT_ACTION_FENCE = "```mswea_bash_command"


def _single_bash_tool(info: RequestInfo) -> bool:
    declared = shapes.tools(info)
    if len(declared) != 1 or shapes.tool_name(declared[0]) != "bash":
        return False
    props = shapes.tool_parameters(declared[0]).get("properties")
    return isinstance(props, Mapping) and set(props) == {"command"}


class MiniSWEAgentAdapter(HarnessAdapter):
    """mini-swe-agent (tool-calling ``litellm`` model class or ``litellm_textbased``)."""

    name = "mini_swe_agent"
    title = "mini-swe-agent"
    boundaries = COMMON_BOUNDARIES + (
        EditBoundary("M1", "format error: the generated reply is discarded and a user error "
                     "message appended (tail rollback)", AnchorKind.GENERATION_START, True),
        EditBoundary("M2", "optional cache markers: last message string becomes one text part "
                     "(set_cache_control, off by default)", AnchorKind.TURN_START, False),
    )

    def detect(self, info: RequestInfo) -> float:
        """See the module docstring for the signals and their confidences."""
        texts = shapes.system_texts(info) + shapes.first_user_texts(info, 1)
        marked = shapes.any_contains(texts, SUBMIT_COMMAND) or shapes.any_contains(texts, TEXT_ACTION_FENCE)
        single_bash = _single_bash_tool(info)
        if marked:
            return 0.9 if single_bash else 0.85
        return 0.5 if single_bash else 0.0
