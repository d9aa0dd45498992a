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

# the offline policies and their replay need numpy only: imported here (``replay`` names both a
# submodule and its function; importing the function last keeps the function)
from freetoken.offload.policies import (
    LRU,
    Access,
    Belady,
    BeladyBypass,
    CachePolicy,
    DecayedLFU,
    FrequencyOracle,
    PrefillHotSet,
    StaticHotSet,
    access_counts,
    top_ids,
    uniform_hot_set,
)
from freetoken.offload.replay import ReplayCounts, ReplayStep, build_steps, replay, schedule

# name -> submodule importing torch: imported on first use, so that the light modules of this
# package (``control``, ``moe_config``) load without torch (``freetoken serve`` answers /health
# before torch is imported)
_LAZY = {
    **dict.fromkeys(("MoeProfile", "default_profile_path", "load_profile", "measure_profile",
                     "save_profile"), "profile"),
    "RoutingRecorder": "recorder",
}
__all__ = sorted([*_LAZY, "LRU", "Access", "Belady", "BeladyBypass", "CachePolicy",
                  "DecayedLFU", "FrequencyOracle", "PrefillHotSet", "StaticHotSet",
                  "access_counts", "top_ids", "uniform_hot_set", "ReplayCounts", "ReplayStep",
                  "build_steps", "replay", "schedule"])


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
