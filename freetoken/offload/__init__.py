"""Offloaded MoE runtime (issue 3). So far: expert-cache eviction policies and routing replay."""

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

__all__ = [
    "LRU",
    "Access",
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
