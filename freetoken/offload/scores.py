"""Eviction scores of the live device expert cache, as tensor operations on the cache's device.

These are the online twins of :class:`freetoken.offload.policies.LRU` and
:class:`~freetoken.offload.policies.DecayedLFU` (same definitions, same clocks, same tie rules),
kept per flat id so history survives eviction. A test replays the same access groups through
both and requires identical hits, fills and victims.

Clocks: ``group`` counts access groups (one per MoE layer per step), ``step`` counts engine steps.
"""

from __future__ import annotations

import torch

from freetoken.offload.moe_config import POLICIES  # noqa: F401 - re-exported


class EvictionScores:
    """Base: ``touch(ids)`` after each group's classification, ``score(ids)`` for victims.

    Lower score = evicted first. Subclasses hold per-id state tensors ``[N]`` on ``device``.
    """

    name = "base"

    def __init__(self, num_ids: int, device: torch.device) -> None:
        self.num_ids = num_ids
        self.device = device
        self.group_index = 0
        self.step_index = 0

    def begin_step(self) -> None:
        """Called once per engine step, before its first group (after the previous step)."""

    def end_step(self) -> None:
        """Called once per engine step after its last group."""
        self.step_index += 1

    def touch(self, ids: torch.Tensor) -> None:
        """Record an access to every id of the group (int64 ``[u]``, distinct)."""
        raise NotImplementedError

    def end_group(self) -> None:
        """Advance the group clock (after victims of the group were chosen)."""
        self.group_index += 1

    def score(self, ids: torch.Tensor) -> torch.Tensor:
        """float64 ``[n]`` eviction scores of resident ``ids``."""
        raise NotImplementedError


class LruScores(EvictionScores):
    """Least recently used (FreeToken paper §3.2): score = access-group index of the last use."""

    name = "lru"

    def __init__(self, num_ids: int, device: torch.device) -> None:
        super().__init__(num_ids, device)
        self.last_use = torch.full((num_ids,), -1, dtype=torch.int64, device=device)

    def touch(self, ids: torch.Tensor) -> None:
        """``last_use[ids] = group clock``."""
        self.last_use[ids] = self.group_index

    def score(self, ids: torch.Tensor) -> torch.Tensor:
        """``last_use[ids]``."""
        return self.last_use[ids].to(torch.float64)


class DecayedLfuScores(EvictionScores):
    """Decayed frequency × recency (see ``policies.DecayedLFU``): on an access at step ``t``
    ``f <- f * g**(t - t_last) + 1``; score ``f * g**a / (1 + a)`` with age ``a = t - t_last``,
    ``g = 2**(-1/half_life)``.

    Raises:
        ValueError: ``half_life <= 0``.
    """

    name = "lfu-decay"

    def __init__(self, num_ids: int, device: torch.device, half_life: float = 32.0) -> None:
        super().__init__(num_ids, device)
        if not half_life > 0:
            raise ValueError(f"half_life must be > 0 steps, got {half_life}")
        self.gamma = 2.0 ** (-1.0 / float(half_life))
        self.freq = torch.zeros(num_ids, dtype=torch.float64, device=device)
        self.t_last = torch.zeros(num_ids, dtype=torch.int64, device=device)

    def touch(self, ids: torch.Tensor) -> None:
        """Decay then count the access."""
        age = (self.step_index - self.t_last[ids]).to(torch.float64)
        self.freq[ids] = self.freq[ids] * torch.pow(self.gamma, age) + 1.0
        self.t_last[ids] = self.step_index

    def score(self, ids: torch.Tensor) -> torch.Tensor:
        """Decayed frequency now times ``1 / (1 + age)``."""
        age = (self.step_index - self.t_last[ids]).to(torch.float64)
        return self.freq[ids] * torch.pow(self.gamma, age) / (1.0 + age)


def make_scores(policy: str, num_ids: int, device: torch.device) -> EvictionScores:
    """The score keeper for ``policy`` (one of :data:`POLICIES`).

    Raises:
        ValueError: unknown policy (lists the known ones).
    """
    if policy == "lru":
        return LruScores(num_ids, device)
    if policy == "lfu-decay":
        return DecayedLfuScores(num_ids, device)
    raise ValueError(f"unknown expert-cache policy {policy!r}; choose one of {', '.join(POLICIES)}")
