"""Offloaded MoE runtime (FreeToken paper §3.2-3.3, issue 3).

Host expert banks (``banks``), one device expert cache with a tensor control path (``cache``,
``scores``), the q* miss split with online correction (``split``), the CPU branch
(``cpu_branch``), the per-layer runtime (``runtime``), backend choice and loading (``backend``,
``loading``), the control surface for the server and CLI (``control``), the B_P/B_H profile
(``profile``), the routing recorder (``recorder``), and the offline policies and replay
(``policies``, ``replay``).
"""

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
from freetoken.offload.profile import (
    MoeProfile,
    default_profile_path,
    load_profile,
    measure_profile,
    save_profile,
)
from freetoken.offload.recorder import RoutingRecorder
from freetoken.offload.replay import ReplayCounts, ReplayStep, build_steps, replay, schedule

__all__ = [
    "LRU",
    "Access",
    "MoeProfile",
    "RoutingRecorder",
    "default_profile_path",
    "load_profile",
    "measure_profile",
    "save_profile",
    "Belady",
    "BeladyBypass",
    "CachePolicy",
    "DecayedLFU",
    "FrequencyOracle",
    "PrefillHotSet",
    "ReplayCounts",
    "ReplayStep",
    "StaticHotSet",
    "access_counts",
    "build_steps",
    "replay",
    "schedule",
    "top_ids",
    "uniform_hot_set",
]
