"""Expert-cache eviction policies over one shared pool of S slots (issue 3, "Eviction policies").

The pool holds whole experts named by their flat id ``l * E + e`` (MoE layer ``l``, expert ``e``,
``E`` routed experts per layer), shared by every MoE layer, as in the FreeToken paper §3.2. A
policy is driven one *access group* at a time: the deduplicated routed ids of one MoE layer in
one step (prefill or decode). For each group it reports which ids hit, which misses it fills and
which ids those fills evict. Every id of a group is *pinned* while the group runs: a fill never
evicts an id the same group is about to use, so a group may hold at most S distinct ids. Victims
for all fills of a group are chosen in one pass over the slots (empty slots first, then the
policy's order), which is the shape of the device control path issue 3 asks for.

Two kinds of policy:
- demand-fill (``fills_all_misses = True``): every miss is filled (LRU, decayed LFU, Belady MIN);
- never-evicting hot sets (static at load, re-chosen at prefill, the stationary frequency
  oracle): the set is fixed between reloads and a miss bypasses the cache (its expert runs from
  the host banks, which the engine's q* split allows). ``BeladyBypass`` is the offline optimum
  when bypassing is allowed, so it bounds both kinds.

Everything is numpy: the replay is offline and runs on any machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

NEVER = np.iinfo(np.int64).max  # next-use index of an id that is not accessed again


@dataclass(frozen=True)
class Access:
    """Outcome of one access group (one MoE layer of one step).

    Fields (all numpy int64 unless noted):
        ids: ``[u]`` the group's distinct flat ids, in the order given.
        hit: bool ``[u]``, True where the id was resident before the group ran.
        fill_slots: ``[f]`` slots written for misses (``f`` = number of misses for demand-fill
            policies, 0 for hot sets).
        fill_ids: ``[f]`` ids written into ``fill_slots``.
        evicted: ``[f]`` ids those slots held before (``-1`` for an empty slot).
    """

    ids: np.ndarray
    hit: np.ndarray
    fill_slots: np.ndarray
    fill_ids: np.ndarray
    evicted: np.ndarray

    @property
    def num_hits(self) -> int:
        """Number of ids of the group that were resident."""
        return int(self.hit.sum())

    @property
    def num_misses(self) -> int:
        """Number of ids of the group that were not resident (filled or bypassed)."""
        return int(self.hit.size - self.hit.sum())


def top_ids(counts: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` ids with the largest ``counts`` (int64 ``[<=k]``), only ids with count > 0.

    Ties go to the lower id, so the choice is deterministic. ``counts``: ``[num_ids]`` any
    numeric dtype. Raises ValueError for ``k < 0`` or ``counts`` that is not 1-D.
    """
    counts = np.asarray(counts)
    if counts.ndim != 1 or k < 0:
        raise ValueError(f"top_ids needs 1-D counts and k >= 0, got shape {counts.shape}, k={k}")
    order = np.lexsort((np.arange(counts.size), -counts.astype(np.float64)))
    chosen = order[:k]
    return chosen[counts[chosen] > 0].astype(np.int64)


def uniform_hot_set(num_layers: int, num_experts: int, num_slots: int, seed: int = 0) -> np.ndarray:
    """A routing-blind hot set for load time: ``num_slots`` flat ids spread evenly over layers.

    Each layer gets ``num_slots // num_layers`` experts drawn uniformly without replacement (the
    first ``num_slots % num_layers`` layers one more), from ``numpy.random.default_rng(seed)``.
    Returns int64 ``[min(num_slots, L*E)]``. This is what a loader without a routing profile can
    pin; its expected hit rate is ``S / (L * E)``. Raises ValueError for non-positive sizes.
    """
    if num_layers <= 0 or num_experts <= 0 or num_slots <= 0:
        raise ValueError(f"sizes must be positive: {num_layers=} {num_experts=} {num_slots=}")
    rng = np.random.default_rng(seed)
    per_layer = np.full(num_layers, num_slots // num_layers)
    per_layer[: num_slots % num_layers] += 1
    per_layer = np.minimum(per_layer, num_experts)
    ids = [l * num_experts + rng.choice(num_experts, int(n), replace=False)
           for l, n in enumerate(per_layer) if n > 0]
    return np.sort(np.concatenate(ids)).astype(np.int64)


class CachePolicy:
    """Base class: residency table of one pool of ``num_slots`` slots over ``num_ids`` flat ids.

    State: ``slot_of`` int64 ``[num_ids]`` (slot or -1) and ``id_in`` int64 ``[num_slots]`` (id or
    -1), always mutually inverse. Subclasses give the eviction order (``_victim_score``) and may
    decline fills (``_admit``). ``step(groups, decode)`` runs one engine step (its MoE layers in
    order); ``access(ids)`` runs one group. Raises ValueError for bad sizes or bad groups.
    """

    name = "base"
    fills_all_misses = True

    def __init__(self, num_slots: int, num_ids: int):
        if num_slots <= 0 or num_ids <= 0:
            raise ValueError(f"num_slots and num_ids must be positive, got {num_slots}, {num_ids}")
        self.num_slots = int(num_slots)
        self.num_ids = int(num_ids)
        self.slot_of = np.full(self.num_ids, -1, np.int64)
        self.id_in = np.full(self.num_slots, -1, np.int64)
        self.step_index = 0  # engine steps started so far (decay / recency clock)
        self.group_index = 0  # access groups run so far (LRU clock, Belady schedule position)

    # --- driving -------------------------------------------------------------------------
    def step(self, groups: Sequence[np.ndarray], decode: bool = True) -> list[Access]:
        """Run one engine step: ``groups`` are the per-MoE-layer deduplicated flat ids in layer
        order (a layer may be split into several groups of at most S ids). ``decode`` is False
        for a prefill step. Returns one ``Access`` per group."""
        self._begin_step(decode)
        out = [self.access(g) for g in groups]
        self.step_index += 1
        return out

    def access(self, ids: np.ndarray) -> Access:
        """Run one access group of distinct flat ids (int ``[u]``, ``u <= num_slots``)."""
        ids = self._check(ids)
        slots = self.slot_of[ids]
        hit = slots >= 0
        pinned = np.zeros(self.num_slots, bool)
        pinned[slots[hit]] = True
        self._touch(ids)
        fill_ids = self._admit(ids[~hit], pinned)
        victims = self._choose_victims(fill_ids.size, pinned)
        evicted = self.id_in[victims].copy()
        self.slot_of[evicted[evicted >= 0]] = -1
        self.id_in[victims] = fill_ids
        self.slot_of[fill_ids] = victims
        self.group_index += 1
        return Access(ids, hit, victims, fill_ids, evicted)

    def load(self, ids: np.ndarray) -> None:
        """Replace the whole pool with ``ids`` (distinct, at most S) in slots 0..n-1; the other
        slots become empty. Not an access: no hit, miss or fill is counted."""
        ids = self._check(ids)
        self.slot_of[:] = -1
        self.id_in[:] = -1
        self.id_in[: ids.size] = ids
        self.slot_of[ids] = np.arange(ids.size)

    def check_invariants(self) -> None:
        """Raise AssertionError unless ``slot_of`` and ``id_in`` are inverse (no id in two
        slots, occupancy <= S)."""
        held = self.id_in[self.id_in >= 0]
        assert np.unique(held).size == held.size, "an id sits in two slots"
        assert held.size <= self.num_slots
        assert np.array_equal(self.slot_of[held], np.flatnonzero(self.id_in >= 0))
        assert int((self.slot_of >= 0).sum()) == held.size, "slot_of names an id no slot holds"

    @property
    def occupancy(self) -> int:
        """Number of filled slots."""
        return int((self.id_in >= 0).sum())

    # --- hooks ---------------------------------------------------------------------------
    def _begin_step(self, decode: bool) -> None:
        """Called before each step's groups; ``decode`` False for prefill."""

    def _touch(self, ids: np.ndarray) -> None:
        """Bookkeeping for every accessed id of the group (hits and misses), before victims."""

    def _admit(self, miss_ids: np.ndarray, pinned: np.ndarray) -> np.ndarray:
        """Which misses to fill (int64 ``[f]``); demand-fill policies fill all of them."""
        return miss_ids

    def _victim_score(self, ids: np.ndarray) -> np.ndarray:
        """Eviction order for resident ``ids``: lower score is evicted first (float ``[n]``)."""
        raise NotImplementedError

    # --- helpers -------------------------------------------------------------------------
    def _choose_victims(self, n: int, pinned: np.ndarray) -> np.ndarray:
        """``n`` unpinned slots in one pass: empty slots first (lowest index), then the lowest
        ``_victim_score``; ties go to the lower slot index."""
        if n == 0:
            return np.zeros(0, np.int64)
        score = np.full(self.num_slots, -np.inf)
        full = self.id_in >= 0
        if full.any():
            score[full] = self._victim_score(self.id_in[full])
        score[pinned] = np.inf
        victims = np.argsort(score, kind="stable")[:n]
        if pinned[victims].any():
            raise RuntimeError("victim choice reached a pinned slot (group larger than the pool)")
        return victims.astype(np.int64)

    def _check(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise ValueError(f"an access group is a 1-D integer array, got {ids.dtype} {ids.shape}")
        ids = ids.astype(np.int64, copy=False)
        if ids.size > self.num_slots:
            raise ValueError(f"access group of {ids.size} ids exceeds the pool of {self.num_slots} slots")
        if ids.size:
            s = np.sort(ids)
            if s[0] < 0 or s[-1] >= self.num_ids:
                raise ValueError(f"flat expert id out of range [0, {self.num_ids}): {s[0]}..{s[-1]}")
            if (s[1:] == s[:-1]).any():
                raise ValueError("an access group must be deduplicated (repeated flat id)")
        return ids


class LRU(CachePolicy):
    """Least recently used over the shared pool (FreeToken paper §3.2): evict the resident id
    whose last access group is oldest. The clock is the access-group counter, so a layer run
    earlier in the same step is older than a later one."""

    name = "LRU"

    def __init__(self, num_slots: int, num_ids: int):
        super().__init__(num_slots, num_ids)
        self.last_use = np.full(self.num_ids, -1, np.int64)

    def _touch(self, ids: np.ndarray) -> None:
        self.last_use[ids] = self.group_index

    def _victim_score(self, ids: np.ndarray) -> np.ndarray:
        return self.last_use[ids].astype(np.float64)


class DecayedLFU(CachePolicy):
    """Frequency-aware eviction: decayed frequency × recency, with history kept for every id.

    Clock ``t`` = engine step index (one per prefill or decode step). Each id keeps ``f`` (its
    exponentially decayed access count at its last access) and ``t_last``. On an access at step
    ``t``: ``f <- f * g**(t - t_last) + 1``, ``t_last <- t`` with ``g = 2**(-1 / half_life)``.
    The score of a resident id at step ``t`` with age ``a = t - t_last`` is
    ``f * g**a / (1 + a)``: the decayed frequency now, times a recency factor ``1 / (1 + a)``.
    The lowest score is evicted; ties go to the lower slot. History survives eviction, so an
    expert that was hot before returns with its count (in the spirit of LRFU, Lee et al. 2001).
    Raises ValueError for ``half_life <= 0``.
    """

    name = "LFU-decay"

    def __init__(self, num_slots: int, num_ids: int, half_life: float = 32.0):
        super().__init__(num_slots, num_ids)
        if not half_life > 0:
            raise ValueError(f"half_life must be > 0 steps, got {half_life}")
        self.half_life = float(half_life)
        self.gamma = 2.0 ** (-1.0 / self.half_life)
        self.freq = np.zeros(self.num_ids)
        self.t_last = np.zeros(self.num_ids, np.int64)

    def _touch(self, ids: np.ndarray) -> None:
        t = self.step_index
        self.freq[ids] = self.freq[ids] * self.gamma ** (t - self.t_last[ids]) + 1.0
        self.t_last[ids] = t

    def _victim_score(self, ids: np.ndarray) -> np.ndarray:
        age = self.step_index - self.t_last[ids]
        return self.freq[ids] * self.gamma**age / (1.0 + age)


class StaticHotSet(CachePolicy):
    """A hot set loaded once and never changed: misses bypass the cache (no fill, no eviction).

    ``hot_ids``: int ``[<=S]`` distinct flat ids (e.g. ``uniform_hot_set`` at load, or
    ``top_ids`` of a warm-up slice's counts). Raises ValueError for a bad set.
    """

    name = "static"
    fills_all_misses = False

    def __init__(self, num_slots: int, num_ids: int, hot_ids: np.ndarray, name: str | None = None):
        super().__init__(num_slots, num_ids)
        self.load(hot_ids)
        if name is not None:
            self.name = name

    def _admit(self, miss_ids: np.ndarray, pinned: np.ndarray) -> np.ndarray:
        return miss_ids[:0]


class FrequencyOracle(StaticHotSet):
    """Stationary frequency oracle (issue 3): the S ids accessed in the most groups over the
    whole schedule ``groups`` (ties to the lower id), fixed from the start, never evicting."""

    name = "oracle"

    def __init__(self, num_slots: int, num_ids: int, groups: Sequence[np.ndarray]):
        counts = access_counts(groups, num_ids)
        super().__init__(num_slots, num_ids, top_ids(counts, num_slots))


class PrefillHotSet(StaticHotSet):
    """A hot set re-chosen at each prefill: starts from ``initial_ids`` (the load-time set);
    during prefill steps it counts the groups each id appears in; at the first decode step after
    a prefill it reloads the top-S prefill ids (count > 0, ties to the lower id), keeping ids of
    the previous set in any slots left over. Never evicts between reloads; misses bypass."""

    name = "prefill-hot"

    def __init__(self, num_slots: int, num_ids: int, initial_ids: np.ndarray):
        super().__init__(num_slots, num_ids, initial_ids)
        self.counts = np.zeros(self.num_ids, np.int64)
        self.in_prefill = False
        self.reloads = 0

    def _begin_step(self, decode: bool) -> None:
        if not decode and not self.in_prefill:
            self.counts[:] = 0
        if decode and self.in_prefill:
            chosen = top_ids(self.counts, self.num_slots)
            old = self.id_in[self.id_in >= 0]
            keep = old[~np.isin(old, chosen)][: self.num_slots - chosen.size]
            self.load(np.concatenate([chosen, keep]))
            self.reloads += 1
        self.in_prefill = not decode

    def _touch(self, ids: np.ndarray) -> None:
        if self.in_prefill:
            self.counts[ids] += 1


def access_counts(groups: Sequence[np.ndarray], num_ids: int) -> np.ndarray:
    """Number of groups each flat id appears in: int64 ``[num_ids]``."""
    counts = np.zeros(num_ids, np.int64)
    if len(groups):
        flat = np.concatenate([np.asarray(g, np.int64) for g in groups])
        np.add.at(counts, flat, 1)
    return counts


def next_use_table(groups: Sequence[np.ndarray]) -> list[np.ndarray]:
    """For each group, int64 ``[u]``: the index of the next group using the same id, or NEVER."""
    sizes = np.array([len(g) for g in groups], np.int64)
    if sizes.sum() == 0:
        return [np.zeros(0, np.int64) for _ in groups]
    flat = np.concatenate([np.asarray(g, np.int64) for g in groups])
    gidx = np.repeat(np.arange(len(groups)), sizes)
    order = np.lexsort((gidx, flat))
    nxt = np.full(flat.size, NEVER, np.int64)
    same = flat[order[1:]] == flat[order[:-1]]
    nxt[order[:-1][same]] = gidx[order[1:][same]]
    return np.split(nxt, np.cumsum(sizes)[:-1])


class Belady(CachePolicy):
    """Belady's MIN (1966) with demand fill: evict the resident id whose next use is farthest
    (never-used-again first). Offline: built from the full schedule ``groups`` it will be driven
    with, in order; optimal among policies that fill every miss. Raises ValueError when driven
    with a group other than the scheduled one."""

    name = "MIN"

    def __init__(self, num_slots: int, num_ids: int, groups: Sequence[np.ndarray]):
        super().__init__(num_slots, num_ids)
        self.schedule = [np.asarray(g, np.int64) for g in groups]
        self.next_use = next_use_table(self.schedule)
        self.next_of_id = np.full(self.num_ids, NEVER, np.int64)

    def _touch(self, ids: np.ndarray) -> None:
        g = self.group_index
        if g >= len(self.schedule) or not np.array_equal(ids, self.schedule[g]):
            raise ValueError(f"{self.name} driven off its schedule at group {g}")
        self.next_of_id[ids] = self.next_use[g]

    def _victim_score(self, ids: np.ndarray) -> np.ndarray:
        return -self.next_of_id[ids].astype(np.float64)


class BeladyBypass(Belady):
    """Belady's MIN when a miss may bypass the cache: of the unpinned residents and this group's
    misses, keep the ``S - hits`` with the nearest next use (residents win ties) and fill the
    kept misses; the rest are evicted or bypassed. Exactly optimal when every group holds one id
    (checked by exhaustive search); with several ids per group it is a greedy near-bound (an
    exhaustive search beat it by one hit on ~4% of tiny random traces), so read it as the bound
    for every policy here, including the never-evicting hot sets, only approximately. Like them it starts full, at no cost: preloaded with
    the S ids whose first use comes earliest (then earliest second use, then lower id)."""

    name = "MIN+bypass"
    fills_all_misses = False

    def __init__(self, num_slots: int, num_ids: int, groups: Sequence[np.ndarray]):
        super().__init__(num_slots, num_ids, groups)
        if self.schedule:
            # earliest first use; among ids first used by the same group, earliest second use
            flat = np.concatenate(self.schedule)
            gidx = np.repeat(np.arange(len(self.schedule)), [g.size for g in self.schedule])
            uniq, first = np.unique(flat, return_index=True)
            second = np.concatenate(self.next_use)[first]
            self.load(uniq[np.lexsort((uniq, second, gidx[first]))][: self.num_slots])

    def _admit(self, miss_ids: np.ndarray, pinned: np.ndarray) -> np.ndarray:
        free_capacity = self.num_slots - int(pinned.sum())
        if miss_ids.size == 0:
            return miss_ids
        res = self.id_in[(self.id_in >= 0) & ~pinned]
        cand = np.concatenate([res, miss_ids])
        is_miss = np.zeros(cand.size, bool)
        is_miss[res.size :] = True
        nxt = self.next_of_id[cand]
        order = np.lexsort((cand, is_miss, nxt))  # nearest next use, residents first, lower id
        keep = order[:free_capacity]
        return cand[np.sort(keep[is_miss[keep]])]
