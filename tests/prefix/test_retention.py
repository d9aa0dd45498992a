"""Value-aware victim choice of recurrent-state checkpoints (retention.pick_victim)."""

from __future__ import annotations

import pytest

from freetoken.prefix.retention import deeper_checkpoint_counts, is_redundant, pick_victim

from tests.prefix.stand_ins import Node


def grow(parent: Node, *depths: int, checkpoints=None) -> list[Node]:
    """A chain of nodes under ``parent``; ``checkpoints[i]`` is the id of node i (None: none)."""
    nodes = []
    for i, depth in enumerate(depths):
        node = Node(parent=parent, depth=depth)
        node.checkpoint = checkpoints[i] if checkpoints else None
        parent.children[depth * 1000 + len(parent.children)] = node  # any distinct key
        nodes.append(node)
        parent = node
    return nodes


def test_redundant_means_keep_deepest_checkpoints_below_on_every_path():
    root = Node()
    a1, a2, a3, a4 = grow(root, 10, 20, 30, 40, checkpoints=[1, 2, 3, None])  # a4: tokens, no checkpoint
    counts = deeper_checkpoint_counts([a1])
    assert [counts[id(n)] for n in (a1, a2, a3, a4)] == [2, 1, 0, 0]
    assert [is_redundant(n, 2) for n in (a1, a2, a3)] == [True, False, False]
    assert [is_redundant(n, 1) for n in (a1, a2, a3)] == [True, True, False]
    # A branch under a2 with only one checkpoint: a1 now has a path with 1 deeper checkpoint.
    (b1,) = grow(a2, 25, checkpoints=[4])
    assert deeper_checkpoint_counts([a1])[id(a1)] == 2  # via b1: a2 + b1 = 2; via a3: a2 + a3 = 2
    grow(a1, 15, checkpoints=[None])  # a branch of a1 with no checkpoint at all
    assert deeper_checkpoint_counts([a1])[id(a1)] == 0
    assert not is_redundant(a1, 1) and is_redundant(a1, 0)


def test_made_redundant_by_deeper_one_goes_before_older_non_redundant():
    root = Node()
    (b1,) = grow(root, 5, checkpoints=[7])             # another thread, the deepest of its path
    a1, a2, a3 = grow(root, 10, 20, 30, checkpoints=[1, 2, 3])
    cands = [(7, b1, 1.0), (1, a1, 5.0), (2, a2, 6.0), (3, a3, 7.0)]
    # Gains: b1 5 (no checkpoint above it), a1 10, a2 20 - 10 = 10, a3 30 - 20 = 10.
    # keep_deepest=2: only a1 has 2 checkpoints below it (a2, a3), so only a1 is class 0; class comes
    # before gain and age: a1 goes although b1 is older and saves fewer tokens.
    assert pick_victim(cands, keep_deepest=2) == 1
    # Without a1 as a candidate nothing is class 0 (a2 has 1 below): the smallest gain, b1's 5.
    assert pick_victim(cands[:1] + cands[2:], keep_deepest=2) == 7
    assert pick_victim(cands, keep_deepest=3) == 7     # 2 deeper ones are not enough for 3: gain
    # keep_deepest=0: every node is class 0 (none has 2 children): gain first, then age.
    assert pick_victim(cands, keep_deepest=0) == 7
    assert pick_victim(cands[1:], keep_deepest=0) == 1  # a1, a2, a3 all gain 10: a1 is the oldest


def test_gain_beats_age_within_a_class():
    """An old checkpoint that saves many tokens outlives a newer one that saves few; the gain is
    measured to the next shallower node that holds a checkpoint (nodes without one are skipped),
    or to the root when there is none."""
    root = Node()
    (old,) = grow(root, 300, checkpoints=[1])
    s, m, t = grow(root, 400, 405, 410, checkpoints=[2, None, 3])
    # keep_deepest=2: old and t have no checkpoint below (class 1). Gains: old 300; t 410 - 400 = 10
    # (m holds no checkpoint, s does). t goes although it was used last.
    assert pick_victim([(1, old, 1.0), (3, t, 9.0)], keep_deepest=2) == 3
    # Same with both in class 0 (keep_deepest=0).
    assert pick_victim([(1, old, 1.0), (3, t, 9.0)], keep_deepest=0) == 3
    # s dropped: t's gain is now its depth, 410 > 300: old goes although t is the older one now.
    s.checkpoint = None
    assert pick_victim([(1, old, 9.0), (3, t, 1.0)], keep_deepest=2) == 1


def test_branch_point_is_never_redundant():
    """A checkpoint where conversations diverged (a node with 2 children) is class 1 even when every
    path below it holds keep_deepest deeper checkpoints."""
    root = Node()
    (system,) = grow(root, 100, checkpoints=[1])            # shared system prompt
    grow(system, 200, 300, checkpoints=[2, 3])              # sub-agent u
    v1, _ = grow(system, 150, 250, checkpoints=[4, 5])      # sub-agent v
    _, w1 = grow(root, 480, 500, checkpoints=[6, 7])        # an unrelated thread
    assert len(system.children) == 2
    assert deeper_checkpoint_counts([system])[id(system)] == 2  # 2 checkpoints below on each path
    # keep_deepest=2: system is a branch point, so class 1 like w1 (nothing below w1). Gains: system
    # 100, w1 500 - 480 = 20: w1 goes although system is older and looks redundant.
    cands = [(1, system, 0.0), (7, w1, 9.0)]
    assert pick_victim(cands, keep_deepest=2) == 7
    # Without sub-agent v, system has one child and 2 checkpoints below it: class 0, it goes first.
    del system.children[next(k for k, c in system.children.items() if c is v1)]
    assert pick_victim(cands, keep_deepest=2) == 1


def test_ties_and_locks():
    root = Node()
    # Three separate paths at the same depth: equal gain (10) and class (1), so age and listing
    # order decide.
    x, y, z = (grow(root, 10, checkpoints=[c])[0] for c in (1, 2, 3))
    assert pick_victim([(1, x, 3.0), (2, y, 3.0), (3, z, 4.0)], 2) == 1  # same last_use: listed first
    assert pick_victim([(2, y, 3.0), (1, x, 3.0), (3, z, 4.0)], 2) == 2
    x.lock_ref = 1
    assert pick_victim([(1, x, 0.0), (2, y, 3.0)], 2) == 2
    # A locked checkpoint outlives an unlocked one even when it is redundant and older.
    under = grow(x, 40, 50, checkpoints=[4, 5])
    assert is_redundant(x, 2)
    assert pick_victim([(1, x, 0.0), (3, z, 9.0)], 2) == 3
    y.lock_ref = z.lock_ref = 2
    # Only locked ones left: the normal order among them (x redundant goes first).
    assert pick_victim([(2, y, 0.0), (3, z, 1.0), (1, x, 5.0)], 2) == 1
    assert pick_victim([(2, y, 1.0), (3, z, 0.0)], 2) == 3
    # Both locked, both class 1 at keep_deepest=3 (x has 2 below, under[0] 1): the smaller gain goes
    # first whatever the age (x 10 vs under[0] 40 - 10 = 30).
    under[0].lock_ref = 1
    assert pick_victim([(1, x, 9.0), (4, under[0], 0.0)], 3) == 1
    assert under[0].checkpoint == 4


def test_two_threads_filling_from_one_evicts_its_own_shallow_checkpoints():
    """Thread B saved a chain of 3 checkpoints long ago; thread A then saves a chain of 6 deeper and
    deeper ones. Capacity 6, keep_deepest=2: every eviction takes a redundant checkpoint (2 deeper
    ones below it), the one saving the fewest tokens; B's two deepest survive although they are
    older than all of A's (plain LRU would evict those), and A's survivors stay spread along its
    path."""
    root = Node()
    system = grow(root, 100, checkpoints=[None])[0]        # shared system prompt, no checkpoint
    b_nodes = grow(system, 200, 300, 400, checkpoints=[None] * 3)
    a_nodes = grow(system, 250, 350, 450, 550, 650, 750, checkpoints=[None] * 6)
    live: dict[int, tuple[Node, float]] = {}
    clock = iter(range(1000))
    for i, n in enumerate(b_nodes):
        n.checkpoint = 100 + i
        live[100 + i] = (n, next(clock))
    evicted = []
    capacity = 6
    for i, n in enumerate(a_nodes):
        n.checkpoint = i
        if len(live) == capacity:
            victim = pick_victim([(c, node, t) for c, (node, t) in live.items()], keep_deepest=2)
            live.pop(victim)[0].checkpoint = None
            evicted.append(victim)
        live[i] = (n, next(clock))
    # Class 0 = 2+ checkpoints below; gain = depth - depth of the next checkpointed ancestor (system
    # and root hold none).
    # a3 saved: class 0 = {b0 (gain 200), a0 (250), a1 (350 - 250 = 100)} -> a1 (index 1).
    # a4 saved: class 0 = {b0 (200), a0 (250), a2 (450 - 250 = 200; a1 has none)}; b0 and a2 tie
    #   on gain, b0 is older -> 100.
    # a5 saved: class 0 = {a0 (250), a2 (200), a3 (550 - 450 = 100)} (b1 has 1 below) -> 3.
    assert evicted == [1, 100, 3]
    assert sorted(c for c in live if c >= 100) == [101, 102]   # B keeps its 2 deepest
    assert sorted(c for c in live if c < 100) == [0, 2, 4, 5]
    assert [n.depth for n in a_nodes if n.checkpoint is not None] == [250, 450, 650, 750]
    assert [n.checkpoint for n in b_nodes] == [None, 101, 102]


def test_deep_chain_and_errors():
    root = Node()
    chain = grow(root, *range(1, 5001), checkpoints=list(range(5000)))  # deeper than the recursion limit
    assert deeper_checkpoint_counts([chain[0]])[id(chain[0])] == 4999
    assert pick_victim([(c, chain[c], 0.0) for c in (4999, 10, 4998)], 2) == 10
    with pytest.raises(ValueError, match="^pick_victim needs at least one candidate checkpoint$"):
        pick_victim([], 2)
    with pytest.raises(ValueError, match="^keep_deepest must be >= 0, got -1$"):
        pick_victim([(0, chain[0], 0.0)], -1)


def test_only_the_end_of_a_running_requests_lock_is_protected():
    """A running request locks its whole path, but needs only the checkpoint its lock ends at
    (its restore point or latest snapshot); the shallower ones on its path compete normally."""
    root = Node()
    a1, a2, a3 = grow(root, 10, 20, 30, checkpoints=[1, 2, 3])
    (b1,) = grow(root, 50, checkpoints=[4])  # another thread, unlocked, gain 50
    for node in (a1, a2, a3):
        node.lock_ref = 1  # RadixTree.lock(a3) counts the node and every ancestor
    # a1: locked but not the end of the lock, gain 10 < 50: it goes despite the lock
    assert pick_victim([(1, a1, 5.0), (4, b1, 1.0)], keep_deepest=0) == 1
    # a3: the end of the lock, protected although older and worth less
    assert pick_victim([(3, a3, 0.0), (4, b1, 1.0)], keep_deepest=0) == 4
    # a second request locked only to a2: a2 is now the end of that lock
    a2.lock_ref += 1
    a1.lock_ref += 1
    assert pick_victim([(2, a2, 0.0), (4, b1, 1.0)], keep_deepest=0) == 4
    assert pick_victim([(1, a1, 0.0), (4, b1, 1.0)], keep_deepest=0) == 1
