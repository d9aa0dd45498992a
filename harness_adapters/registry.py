"""The adapters by name, and detection of the harness behind a request.

Precedence: the ``X-FreeToken-Harness`` header names the adapter outright; otherwise every
adapter scores the request and the highest confidence above 0 wins (a tie goes to the adapter
listed first in :func:`adapter_names`); nothing above 0 gives the generic adapter.
"""

from __future__ import annotations

from harness_adapters.base import HarnessAdapter, RequestInfo
from harness_adapters.claude_code import ClaudeCodeAdapter
from harness_adapters.codex import CodexAdapter
from harness_adapters.generic import GenericAdapter
from harness_adapters.mini_swe_agent import MiniSWEAgentAdapter
from harness_adapters.openclaw import OpenClawAdapter
from harness_adapters.opencode import OpenCodeAdapter
from harness_adapters.swe_agent import SWEAgentAdapter

HARNESS_HEADER = "x-freetoken-harness"

_ADAPTERS: tuple[HarnessAdapter, ...] = (
    ClaudeCodeAdapter(), OpenCodeAdapter(), OpenClawAdapter(), SWEAgentAdapter(),
    MiniSWEAgentAdapter(), CodexAdapter(), GenericAdapter(),
)
_BY_NAME = {a.name: a for a in _ADAPTERS}
# Other spellings, after lower-casing and turning "-" and spaces into "_".
_ALIASES = {"claude": "claude_code", "claudecode": "claude_code", "mini": "mini_swe_agent",
            "mini_swe": "mini_swe_agent", "sweagent": "swe_agent", "codex_cli": "codex"}
_GENERIC = _BY_NAME["generic"]


def adapter_names() -> tuple[str, ...]:
    """Canonical adapter names, in precedence order, ``"generic"`` last."""
    return tuple(a.name for a in _ADAPTERS)


def get_adapter(name: str) -> HarnessAdapter:
    """The adapter called ``name``: a canonical name or an alias (``"claude"``,
    ``"claude-code"``, ``"mini-swe-agent"``, ``"mini"``, ``"swe-agent"``...), case-insensitive.

    Raises:
        TypeError: ``name`` is not a string.
        ValueError: ``unknown harness 'x'; expected one of: claude_code, opencode, ...``.
    """
    if not isinstance(name, str):
        raise TypeError(f"harness name must be a string, got {type(name).__name__}")
    key = name.strip().lower().replace("-", "_").replace(" ", "_")
    adapter = _BY_NAME.get(_ALIASES.get(key, key))
    if adapter is None:
        raise ValueError(f"unknown harness {name!r}; expected one of: {', '.join(adapter_names())}")
    return adapter


def detection_scores(info: RequestInfo) -> dict[str, float]:
    """Every adapter's confidence for ``info``, by canonical name in precedence order."""
    return {a.name: a.detect(info) for a in _ADAPTERS}


def detect_adapter(info: RequestInfo) -> HarnessAdapter:
    """The adapter for ``info`` (see the module docstring for the precedence).

    Raises:
        ValueError: the ``X-FreeToken-Harness`` header names no known harness (the message of
            :func:`get_adapter`).
    """
    forced = info.header(HARNESS_HEADER).strip()
    if forced:
        return get_adapter(forced)
    best, best_score = _GENERIC, 0.0
    for adapter in _ADAPTERS:
        score = adapter.detect(info)
        if score > best_score:
            best, best_score = adapter, score
    return best
