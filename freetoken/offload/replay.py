"""Replay recorded top-k routing through cache policies (issue 3, benchmark 3 "Policy replay").

A trace ``topk_ids`` int ``[tokens, layers, k]`` (``-1`` = not recorded) becomes a list of
``ReplayStep``: each step is a set of trace rows run together (one decode token, one batched
decode step, or a whole prefill), and holds per MoE layer the deduplicated flat ids
``l * E + e`` routed by any of its rows. A layer with more distinct ids than the pool is split
into consecutive groups of at most S ids (first-appearance order), so every group fits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from freetoken.offload.policies import CachePolicy


@dataclass(frozen=True)
class ReplayStep:
    """One engine step of a replay.

    groups: per MoE layer (in layer order, a layer possibly split), int64 ``[u <= S]`` distinct
        flat ids. decode: False for a prefill step. scored: whether its hits count in the result.
    """

    groups: tuple[np.ndarray, ...]
    decode: bool
    scored: bool


@dataclass(frozen=True)
class ReplayCounts:
    """Totals over the scored steps: accesses (distinct ids per group), hits, fills, evictions
    (fills that replaced a resident id)."""

    accesses: int
    hits: int
    fills: int
    evictions: int

    @property
    def hit_rate(self) -> float:
        """hits / accesses (NaN when nothing was scored)."""
        return self.hits / self.accesses if self.accesses else float("nan")


def build_steps(
    topk_ids: np.ndarray,
    num_experts: int,
    num_slots: int,
    step_rows: Sequence[np.ndarray],
    decode: Sequence[bool],
    scored: Sequence[bool],
) -> list[ReplayStep]:
    """Turn trace rows into replay steps.

    topk_ids: int ``[T, L, k]`` expert ids in ``[0, num_experts)`` or ``-1``. step_rows: per step,
    the int row indices run together. decode / scored: one flag per step. Raises ValueError for a
    bad shape, an expert id out of range, or mismatched lengths.
    """
    ids = np.asarray(topk_ids)
    if ids.ndim != 3:
        raise ValueError(f"topk_ids must be [tokens, layers, k], got shape {ids.shape}")
    if ids.size and (ids.max() >= num_experts or ids.min() < -1):
        raise ValueError(f"expert ids must lie in [-1, {num_experts}), got {ids.min()}..{ids.max()}")
    if not len(step_rows) == len(decode) == len(scored):
        raise ValueError("step_rows, decode and scored must have one entry per step")
    offsets = (np.arange(ids.shape[1], dtype=np.int64) * num_experts)[None, :, None]
    flat = np.where(ids >= 0, ids.astype(np.int64) + offsets, -1)
    steps = []
    for rows, dec, sc in zip(step_rows, decode, scored):
        groups: list[np.ndarray] = []
        for layer in range(ids.shape[1]):
            layer_ids = flat[np.asarray(rows), layer, :].reshape(-1)
            layer_ids = layer_ids[layer_ids >= 0]
            uniq, first = np.unique(layer_ids, return_index=True)
            uniq = uniq[np.argsort(first, kind="stable")]
            groups += [uniq[i : i + num_slots] for i in range(0, uniq.size, num_slots)]
        steps.append(ReplayStep(tuple(groups), bool(dec), bool(sc)))
    return steps


def schedule(steps: Sequence[ReplayStep], scored_only: bool = False) -> list[np.ndarray]:
    """All groups of ``steps`` in execution order (the input Belady and the oracle need)."""
    return [g for s in steps if s.scored or not scored_only for g in s.groups]


def replay(policy: CachePolicy, steps: Sequence[ReplayStep]) -> ReplayCounts:
    """Drive ``policy`` through ``steps``; return totals over the scored steps. Unscored steps
    (prefill, warm-up) still change the cache."""
    accesses = hits = fills = evictions = 0
    for step in steps:
        results = policy.step(step.groups, decode=step.decode)
        if step.scored:
            for r in results:
                accesses += r.ids.size
                hits += r.num_hits
                fills += r.fill_ids.size
                evictions += int((r.evicted >= 0).sum())
    return ReplayCounts(accesses, hits, fills, evictions)
