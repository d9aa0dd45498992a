"""The fallback for requests no adapter recognises (a plain SDK call, litellm, an unknown agent).

It assumes only the boundaries every harness has (B0 re-rendered tail, B1 template thinking
drop; shared/research/harnesses.md §0): checkpoints at turn starts and at each generation's start
and end, no normalisation, an append-only history.
"""

from __future__ import annotations

from harness_adapters.base import COMMON_BOUNDARIES, HarnessAdapter, RequestInfo


class GenericAdapter(HarnessAdapter):
    """Any other client."""

    name = "generic"
    title = "Generic client"
    boundaries = COMMON_BOUNDARIES

    def detect(self, info: RequestInfo) -> float:
        """Always 0: the registry falls back to this adapter when nothing else matches."""
        return 0.0
