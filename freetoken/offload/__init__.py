"""Offloaded MoE runtime (FreeToken paper §3.2-3.3, issue 3).

Host expert banks (``banks``), one device expert cache with a tensor control path (``cache``,
``scores``), the q* miss split with online correction (``split``), the CPU branch
(``cpu_branch``), the per-layer runtime (``runtime``), backend choice and loading (``backend``,
``loading``), the control surface for the server and CLI (``control``), the B_P/B_H profile
(``profile``), the routing recorder (``recorder``), and the offline policies and replay
(``policies``, ``replay``).
"""

from __future__ import annotations

import importlib

# name -> submodule; imported on first use so that light modules of this package (``control``)
# load without torch (``freetoken serve`` answers /health before torch is imported)
_EXPORTS = {
    **dict.fromkeys(("LRU", "Access", "Belady", "BeladyBypass", "CachePolicy", "DecayedLFU",
                     "FrequencyOracle", "PrefillHotSet", "StaticHotSet", "access_counts",
                     "top_ids", "uniform_hot_set"), "policies"),
    **dict.fromkeys(("MoeProfile", "default_profile_path", "load_profile", "measure_profile",
                     "save_profile"), "profile"),
    "RoutingRecorder": "recorder",
    **dict.fromkeys(("ReplayCounts", "ReplayStep", "build_steps", "replay", "schedule"),
                    "replay"),
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
