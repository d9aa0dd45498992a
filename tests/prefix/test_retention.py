"""Value-aware victim choice of recurrent-state checkpoints (retention.pick_victim)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from freetoken.prefix.retention import deeper_checkpoint_counts, is_redundant, pick_victim


@dataclass(eq=False)
class Node:
    """Stand-in for RadixNode: only the attributes the retention code may read."""

    parent: Node | None = None
    children: dict[int, Node] = field(default_factory=dict)
    depth: int = 0
    lock_ref: int = 0
    checkpoint: int | None = None


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
    (b1,) = grow(root, 50, checkpoints=[7])            # another thread, the deepest of its path
    a1, a2, a3 = grow(root, 10, 20, 30, checkpoints=[1, 2, 3])
    cands = [(7, b1, 1.0), (1, a1, 5.0), (2, a2, 6.0), (3, a3, 7.0)]
    assert pick_victim(cands, keep_deepest=2) == 1     # a1 is newer than b1 but redundant
    assert pick_victim(cands[:1] + cands[2:], keep_deepest=2) == 7  # without a1 nothing is redundant
    assert pick_victim(cands, keep_deepest=3) == 7     # 2 deeper ones are not enough for 3
    assert pick_victim(cands, keep_deepest=0) == 7     # plain LRU


def test_ties_and_locks():
    root = Node()
    x, y, z = (grow(root, d, checkpoints=[c])[0] for d, c in ((10, 1), (20, 2), (30, 3)))
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
    assert under[0].checkpoint == 4


def test_two_threads_filling_from_one_evicts_its_own_shallow_checkpoints():
    """Thread B saved a chain of 3 checkpoints long ago; thread A then saves a chain of 6 deeper and
    deeper ones. Capacity 6, keep_deepest=2: the first eviction takes B's shallowest (redundant,
    oldest); every later one takes A's own shallowest redundant checkpoint, although B's two deepest
    are older (plain LRU would evict those)."""
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
    # a3 (index 3) triggers the first eviction: b1 (redundant, oldest), then A's own shallow ones.
    assert evicted == [100, 0, 1]
    assert sorted(c for c in live if c >= 100) == [101, 102]   # B keeps its 2 deepest
    assert sorted(c for c in live if c < 100) == [2, 3, 4, 5]
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
