"""Exact hit/miss counts of every expert-cache policy on hand-made traces (issue 3)."""

from __future__ import annotations

import numpy as np
import pytest

from freetoken.offload import (
    LRU,
    Belady,
    BeladyBypass,
    DecayedLFU,
    FrequencyOracle,
    PrefillHotSet,
    StaticHotSet,
    top_ids,
    uniform_hot_set,
)
from freetoken.offload.policies import NEVER, next_use_table

# ids 0 1 0 2 1 0, one single-id group per step, pool of 2 slots
SEQ = [np.array([i]) for i in (0, 1, 0, 2, 1, 0)]


def run(policy, groups):
    """Drive one group per step; return (hits per group, list of Access)."""
    out = []
    for g in groups:
        out += policy.step([g])
        policy.check_invariants()
    return [int(a.hit[0]) if a.ids.size == 1 else a.num_hits for a in out], out


def test_lru_exact():
    hits, acc = run(LRU(2, 3), SEQ)
    assert hits == [0, 0, 1, 0, 0, 0]
    # 2 evicts 1 (used at g1, 0 at g2); 1 evicts 0 (g2 < g3); 0 evicts 2 (g3 < g4)
    assert [a.evicted.tolist() for a in acc] == [[-1], [-1], [], [1], [0], [2]]
    assert [a.fill_slots.tolist() for a in acc] == [[0], [1], [], [1], [0], [1]]


def test_lru_earlier_layer_of_same_step_is_older():
    p = LRU(2, 4)
    p.step([np.array([0]), np.array([1])])  # layer 0 then layer 1
    (a,) = p.step([np.array([2])])
    assert a.evicted.tolist() == [0]
    (b,) = p.step([np.array([1])])
    assert b.hit.tolist() == [True]


def test_decayed_lfu_exact():
    p = DecayedLFU(2, 3, half_life=32.0)
    hits, acc = run(p, SEQ)
    # g3: score(0) = (g^2+1) g / 2 > score(1) = g^2 / 3 -> evict 1;
    # g4: score(0) = (g^2+1) g^2 / 3 > score(2) = g / 2 -> evict 2; g5: 0 hits
    assert hits == [0, 0, 1, 0, 0, 1]
    assert [a.evicted.tolist() for a in acc] == [[-1], [-1], [], [1], [2], []]
    g = 2.0 ** (-1 / 32)
    assert p.freq[0] == pytest.approx(((g**2 + 1) * g**3) + 1)
    assert p.t_last.tolist() == [5, 4, 3]


def test_decayed_lfu_bad_half_life():
    with pytest.raises(ValueError, match="half_life must be > 0 steps, got 0"):
        DecayedLFU(2, 3, half_life=0)


def test_belady_exact():
    hits, acc = run(Belady(2, 3, SEQ), SEQ)
    # g3: next use of 0 is g5, of 1 is g4 -> evict 0; g5: 1 and 2 never used again, lower slot
    assert hits == [0, 0, 1, 0, 1, 0]
    assert [a.evicted.tolist() for a in acc] == [[-1], [-1], [], [0], [], [2]]


def test_belady_bypass_exact():
    p = BeladyBypass(2, 3, SEQ)
    assert sorted(p.id_in.tolist()) == [0, 1]  # preloaded with the two earliest first uses
    hits, acc = run(p, SEQ)
    assert hits == [1, 1, 1, 0, 1, 1]  # 2 is never used again: bypassed
    assert acc[3].fill_ids.size == 0


def test_belady_off_schedule():
    p = Belady(2, 3, SEQ)
    p.step([SEQ[0]])
    with pytest.raises(ValueError, match="MIN driven off its schedule at group 1"):
        p.step([np.array([2])])


def test_static_and_oracle_exact():
    hits, acc = run(StaticHotSet(2, 3, np.array([2, 1])), SEQ)
    assert hits == [0, 1, 0, 1, 1, 0]
    assert all(a.fill_ids.size == 0 for a in acc)
    oracle = FrequencyOracle(2, 3, SEQ)  # counts 0:3 1:2 2:1
    assert sorted(oracle.id_in.tolist()) == [0, 1]
    hits, _ = run(oracle, SEQ)
    assert hits == [1, 1, 1, 0, 1, 1]


def test_prefill_hot_set_exact():
    p = PrefillHotSet(2, 4, np.array([3]))
    a = p.step([np.array([0, 1]), np.array([2])], decode=False)
    b = p.step([np.array([0]), np.array([2, 3])], decode=False)
    assert [x.num_hits for x in a + b] == [0, 0, 0, 1]  # only the load-time 3 hits
    c = p.step([np.array([0]), np.array([3])], decode=True)  # reloaded to top counts {0, 2}
    assert sorted(p.id_in.tolist()) == [0, 2]
    assert [x.hit.tolist() for x in c] == [[True], [False]]
    assert p.reloads == 1 and all(x.fill_ids.size == 0 for x in a + b + c)
    p.step([np.array([2])], decode=True)
    assert p.reloads == 1


def test_hits_are_pinned_within_a_group():
    groups = [np.array([0, 1]), np.array([1, 2]), np.array([0])]
    p = Belady(2, 3, groups)
    p.step([groups[0]])
    (a,) = p.step([groups[1]])  # 1 is never used again but is pinned: 0 must go
    assert a.hit.tolist() == [True, False]
    assert a.fill_ids.tolist() == [2] and a.evicted.tolist() == [0]


@pytest.mark.parametrize(
    "ids, message",
    [
        (np.array([0, 1, 2]), "access group of 3 ids exceeds the pool of 2 slots"),
        (np.array([1, 1]), "an access group must be deduplicated (repeated flat id)"),
        (np.array([4]), "flat expert id out of range [0, 4): 4..4"),
        (np.array([0.5]), "an access group is a 1-D integer array, got float64 (1,)"),
    ],
)
def test_bad_groups(ids, message):
    with pytest.raises(ValueError) as err:
        LRU(2, 4).access(ids)
    assert str(err.value) == message


def test_bad_sizes():
    with pytest.raises(ValueError, match="num_slots and num_ids must be positive, got 0, 4"):
        LRU(0, 4)


def test_top_ids_and_uniform_hot_set():
    assert top_ids(np.array([3, 5, 5, 0, 1]), 3).tolist() == [1, 2, 0]
    assert top_ids(np.array([0, 2, 0]), 3).tolist() == [1]  # zero counts are never chosen
    hot = uniform_hot_set(num_layers=3, num_experts=4, num_slots=7, seed=0)
    assert np.bincount(hot // 4, minlength=3).tolist() == [3, 2, 2]
    assert np.unique(hot).size == 7
    assert np.array_equal(hot, uniform_hot_set(3, 4, 7, seed=0))


def test_next_use_table():
    table = next_use_table([np.array([0, 1]), np.array([1]), np.array([0, 2])])
    assert [t.tolist() for t in table] == [[2, 1], [NEVER], [NEVER, NEVER]]
