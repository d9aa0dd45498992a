"""Per-harness knowledge (Claude Code, OpenCode, OpenClaw, SWE-agent, mini-swe-agent, Codex CLI,
generic): detection, edit boundaries and anchor policies, prefix-buster normalisation and edit
simulators.

Usage::

    from harness_adapters import RequestInfo, detect_adapter

    adapter = detect_adapter(RequestInfo("anthropic", "/v1/messages", headers, body))
    messages = adapter.normalize(from_anthropic(system, msgs))
    policy = adapter.anchor_policy(adapter.version(info))

Sources: shared/research/harnesses.md (edit tables) and real-clients.md (observed requests).
"""

from harness_adapters.base import EditBoundary, HarnessAdapter, RequestInfo
from harness_adapters.registry import (
    HARNESS_HEADER, adapter_names, detect_adapter, detection_scores, get_adapter,
)

__all__ = [
    "HARNESS_HEADER", "EditBoundary", "HarnessAdapter", "RequestInfo", "adapter_names",
    "detect_adapter", "detection_scores", "get_adapter",
]
