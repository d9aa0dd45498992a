"""The device cache's tensor control path against the numpy reference policies (issue 3).

Driving ``ExpertCache.plan`` with every miss filled must reproduce ``policies.LRU`` /
``policies.DecayedLFU`` exactly: same hits, same filled ids, same victim slots, same evictions,
on real recorded routing (../shared/routing) and on hand-made groups.
"""

from __future__ import annotations

import json
import numpy as np
import pytest
import torch

from freetoken.offload import LRU, DecayedLFU
from freetoken.offload.banks import ExpertBanks
from freetoken.offload.cache import ExpertCache
from freetoken.offload.scores import make_scores
from freetoken.paths import shared_dir

ROUTING = shared_dir() / "routing"


def make_cache(layers: int, experts: int, slots: int, policy: str = "lru",
               h: int = 4, i: int = 2) -> ExpertCache:
    banks = ExpertBanks(layers, experts, h, i, torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    banks.gate_up.copy_(torch.randn(banks.gate_up.shape, generator=gen))
    banks.down.copy_(torch.randn(banks.down.shape, generator=gen))
    scores = make_scores(policy, banks.num_ids, torch.device("cpu"))
    return ExpertCache(banks, slots, torch.device("cpu"), torch.float32, scores)


def all_fill(m: int, free: int, *_: int) -> int:
    return min(m, free)


def synthetic_steps(max_steps: int, layers: int = 48, experts: int = 128,
                    k: int = 6) -> list[np.ndarray]:
    """Routing with locality when the shared recordings are absent: per layer a fixed Zipf-like
    popularity, and each token keeps half of the previous token's experts."""
    rng = np.random.default_rng(0)
    popularity = 1.0 / np.arange(1, experts + 1) ** 1.1
    perms = [rng.permutation(experts) for _ in range(layers)]
    prev = [rng.choice(experts, k, replace=False) for _ in range(layers)]
    steps = []
    for _ in range(max_steps):
        row = np.empty((layers, k), np.int64)
        for l in range(layers):
            keep = prev[l][: k // 2]
            p = popularity.copy()
            p[np.isin(perms[l], keep)] = 0
            new = rng.choice(perms[l], k - keep.size, replace=False, p=p / p.sum())
            row[l] = prev[l] = np.concatenate([keep, new])
        steps.append(row)
    return steps


def recorded_steps(name: str, max_steps: int) -> tuple[list[np.ndarray], int, int]:
    """Decode rows of a recorded trace in ../shared/routing, or synthetic ones without it."""
    if not (ROUTING / name).is_file():
        steps = synthetic_steps(max_steps)
        return steps, steps[0].shape[0], 128
    z = np.load(ROUTING / name)
    meta = json.loads(str(z["meta"]))
    ids = z["topk_ids"].astype(np.int64)[:max_steps]  # [steps, L, k]
    return list(ids), ids.shape[1], int(meta["num_experts"])


@pytest.mark.parametrize("policy,reference", [("lru", LRU), ("lfu-decay", DecayedLFU)])
@pytest.mark.parametrize("slots", [16, 97, 600])
def test_plan_matches_numpy_policy_on_recorded_routing(policy, reference, slots):
    steps, layers, experts = recorded_steps("bigmoeonedge_qwen_decode.npz", 30)
    cache = make_cache(layers, experts, slots, policy)
    ref = reference(slots, layers * experts)
    total_hits = 0
    for row in steps:  # one decode step: [L, k]
        groups = []
        for l in range(layers):
            valid = row[l][row[l] >= 0]
            groups.append(np.unique(valid + l * experts))
        expected = ref.step(groups)
        cache.scores.begin_step()
        for l, acc in enumerate(expected):
            valid = row[l][row[l] >= 0]
            if valid.size == 0:
                continue
            plan = cache.plan(l, torch.from_numpy(valid)[None, :], all_fill)
            assert plan.hits == acc.num_hits
            assert plan.fill_ids.tolist() == acc.fill_ids.tolist()
            assert plan.fill_slots.tolist() == acc.fill_slots.tolist()
            assert plan.evictions == int((acc.evicted >= 0).sum())
            assert (plan.slot_ids >= 0).all()  # every entry runs on the device
            cache.fill(plan)
            total_hits += plan.hits
        cache.scores.end_step()
        assert torch.equal(torch.from_numpy(ref.slot_of), cache.slot_of)
    cache.check_invariants()
    if slots >= 600:  # LRU thrashes below ~2 steps' worth of experts; a big pool must hit
        assert total_hits > 0


def test_group_larger_than_cache_sends_the_rest_to_cpu():
    cache = make_cache(1, 8, 2)
    ids = torch.tensor([[0, 1, 2], [3, 1, 0]])  # 4 distinct; 1 and 0 have 2 tokens each
    plan = cache.plan(0, ids, all_fill)
    assert (plan.distinct, plan.hits, plan.fills, plan.cpu_experts) == (4, 0, 2, 2)
    assert sorted(plan.fill_ids.tolist()) == [0, 1]  # most-routed misses are filled first
    slot_of = {n: s for n, s in zip(plan.fill_ids.tolist(), plan.fill_slots.tolist())}
    assert plan.slot_ids.tolist() == [[slot_of[0], slot_of[1], -1], [-1, slot_of[1], slot_of[0]]]
    cache.fill(plan)
    cache.check_invariants()
    # next group: 0 hits (pinned), a new miss may only evict the slot of 1
    plan = cache.plan(0, torch.tensor([[0, 5]]), all_fill)
    assert (plan.hits, plan.fills, plan.evictions) == (1, 1, 1)
    assert plan.fill_slots.tolist() == [slot_of[1]]
    cache.fill(plan)
    cache.check_invariants()


def test_forced_q_fills_exactly_q_and_marks_the_rest():
    cache = make_cache(2, 8, 6)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    for q in range(0, 6):
        cache.preload(torch.empty(0, dtype=torch.int64))
        plan = cache.plan(1, ids, lambda m, free, *_, q=q: min(q, m, free))
        assert (plan.misses, plan.fills, plan.cpu_experts) == (5, q, 5 - q)
        assert int((plan.slot_ids < 0).sum()) == 5 - q
        assert torch.equal(plan.flat_ids, ids + 8)
        cache.fill(plan)
        cache.check_invariants()


def test_resize_keeps_highest_scored_residents():
    cache = make_cache(1, 8, 4)
    for e in (0, 1, 2, 3, 1, 2):  # LRU order after: 0 oldest, then 3, 1, 2 newest
        cache.scores.begin_step()
        cache.fill(cache.plan(0, torch.tensor([[e]]), all_fill))
        cache.scores.end_step()
    result = cache.resize(2)
    assert (result.old_slots, result.new_slots, result.kept) == (4, 2, 2)
    assert cache.resident_ids().tolist() == [1, 2]
    cache.check_invariants()
    result = cache.resize(8)
    assert (result.new_slots, result.kept) == (8, 2)
    assert cache.resident_ids().tolist() == [1, 2]
    cache.check_invariants()
    with pytest.raises(ValueError, match=r"expert cache size must be in \[1, 8\] slots, got 0"):
        cache.resize(0)


def test_preload_rejects_repeats_and_overflow():
    cache = make_cache(1, 8, 2)
    with pytest.raises(ValueError, match="preload needs at most 2 distinct ids"):
        cache.preload(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="preload needs at most 2 distinct ids"):
        cache.preload(torch.tensor([1, 1]))
    cache.preload(torch.tensor([5, 6]))
    assert cache.resident_ids().tolist() == [5, 6]
    cache.check_invariants()
