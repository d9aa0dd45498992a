"""Radix tree over KV token slots: matching, edge splits, refcounts, locks, LRU eviction, and a
seeded random run against a brute-force reference (longest common prefix over stored tokens)."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
import torch

from freetoken.prefix.kv_pool import KVLayout, KVPagePool, OutOfPages
from freetoken.prefix.radix import RadixTree

LAYOUT = KVLayout(num_layers=1, num_kv_heads=1, head_dim=1, dtype=torch.float32)


class Clock:
    """Injected clock: 1.0, 2.0, 3.0, ... one tick per call."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def make(num_pages: int = 16, page_size: int = 4, on_evict=None):
    pool = KVPagePool(LAYOUT, num_pages=num_pages, page_size=page_size, device="cpu")
    clock = Clock()
    return pool, RadixTree(pool, on_evict=on_evict, clock=clock), clock


def path_tokens(node) -> list[int]:
    keys = []
    while node.parent is not None:
        keys.append(node.key)
        node = node.parent
    return [t for key in reversed(keys) for t in key]


def test_match_on_empty_tree():
    _, tree, _ = make()
    for query in ([1, 2, 3], []):
        m = tree.match(query)
        assert m.length == 0 and m.node is tree.root
        assert m.slots.dtype == np.int64 and m.slots.shape == (0,)
    assert tree.leaves() == [] and tree.num_tokens == 0 and tree.num_nodes == 0
    tree.check_invariants()


def test_exact_partial_and_diverging_matches():
    pool, tree, _ = make()
    pool.alloc_pages(4)  # slots 0..15
    leaf = tree.insert([1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 5])
    assert leaf.depth == 6 and leaf.key == (1, 2, 3, 4, 5, 6)
    assert pool.refcounts()[:4].tolist() == [5, 3, 1, 1]  # writer + 4 and 2 token refs

    m = tree.match([1, 2, 3, 4, 5, 6])
    assert (m.length, m.slots.tolist(), m.node) == (6, [0, 1, 2, 3, 4, 5], leaf)
    m = tree.match(np.array([1, 2, 3, 4, 5, 6, 7, 8]))
    assert (m.length, m.node) == (6, leaf)
    m = tree.match(torch.tensor([2, 1]))
    assert (m.length, m.node) == (0, tree.root)

    m = tree.match([1, 2, 3, 9])  # ends inside the edge: split at depth 3
    assert (m.length, m.slots.tolist()) == (3, [0, 1, 2])
    upper = m.node
    assert upper.depth == 3 and upper.key == (1, 2, 3) and upper.slots.tolist() == [0, 1, 2]
    assert list(upper.children) == [4] and upper.children[4] is leaf and leaf.parent is upper
    assert leaf.key == (4, 5, 6) and leaf.slots.tolist() == [3, 4, 5] and leaf.depth == 6
    assert tree.num_nodes == 2 and tree.num_tokens == 6

    # diverging insert: tokens 1,2,3 already stored (their slots win), 7,8 are new
    other = tree.insert([1, 2, 3, 7, 8], [10, 11, 12, 13, 14])
    assert other.depth == 5 and other.parent is upper and other.slots.tolist() == [13, 14]
    assert pool.refcounts()[:4].tolist() == [5, 3, 1, 3]  # only slots 13, 14 (page 3) counted
    m = tree.match([1, 2, 3, 7, 8, 9])
    assert (m.length, m.slots.tolist(), m.node) == (5, [0, 1, 2, 13, 14], other)
    assert sorted(path_tokens(n) for n in tree.leaves()) == [[1, 2, 3, 4, 5, 6], [1, 2, 3, 7, 8]]
    tree.check_invariants()
    pool.check_invariants()


def test_split_keeps_checkpoint_on_lower_half_and_copies_lock_and_access():
    pool, tree, clock = make()
    pool.alloc_pages(2)
    leaf = tree.insert([5, 6, 7, 8, 9, 10], range(6))
    leaf.checkpoint = 42
    tree.lock(leaf)
    inserted_at = leaf.last_access
    mid = tree.node_at([5, 6, 7, 8, 9, 10, 11], 4)  # split without refreshing access
    assert mid.depth == 4 and mid.key == (5, 6, 7, 8) and mid.checkpoint is None
    assert (mid.lock_ref, mid.last_access) == (1, inserted_at)
    assert (leaf.depth, leaf.key, leaf.checkpoint) == (6, (9, 10), 42)
    assert leaf.last_access == inserted_at
    top = tree.match([5, 6, 0]).node  # split again, refreshes only the matched upper part
    assert top.depth == 2 and top.checkpoint is None and top.lock_ref == 1
    assert top.last_access == clock.now and mid.last_access == inserted_at
    assert [n.depth for n in (top, mid, leaf)] == [2, 4, 6] and mid.parent is top
    assert tree.node_at([5, 6, 7], 3).depth == 3  # node_at on a path that stops at depth 3
    assert tree.node_at([5, 6, 7, 8], 0) is tree.root
    assert tree.node_at([5, 6, 0, 8], 3) is None
    nodes = tree.num_nodes
    assert tree.node_at([5, 6, 7, 0, 9], 5) is None  # mismatch inside an edge: no split
    assert tree.num_nodes == nodes
    assert tree.node_at([5, 6, 7, 8, 9, 10, 11], 7) is None
    with pytest.raises(ValueError, match=r"depth 5 outside \[0, 4\] for 4 tokens"):
        tree.node_at([5, 6, 7, 8], 5)
    tree.unlock(leaf)
    assert [n.lock_ref for n in (top, mid, leaf)] == [0, 0, 0]
    tree.check_invariants()


def test_insert_of_stored_prefix_increfs_nothing():
    pool, tree, _ = make()
    pages = pool.alloc_pages(2)
    full = tree.insert([1, 2, 3, 4, 5, 6, 7, 8], pool.slots_of_pages(pages))
    before = pool.refcounts()
    again = tree.insert([1, 2, 3, 4, 5, 6, 7, 8], [9] * 8)  # any slots: the stored ones win
    assert again is full
    prefix = tree.insert([1, 2, 3, 4, 5], torch.arange(8, 13))
    assert prefix.depth == 5 and prefix.slots.tolist() == [0, 1, 2, 3, 4]
    assert np.array_equal(pool.refcounts(), before) and tree.num_tokens == 8
    assert tree.insert([], []) is tree.root
    with pytest.raises(ValueError, match="insert got 3 tokens but 2 slots"):
        tree.insert([1, 2, 3], [0, 1])
    with pytest.raises(TypeError, match="token ids must be integers"):
        tree.match([1.5])
    with pytest.raises(ValueError, match=r"token ids must be 1-D, got shape \(1, 2\)"):
        tree.match([[1, 2]])
    # a new slot on a free page is refused and the tree keeps no ref to it
    with pytest.raises(RuntimeError, match="free KV pages"):
        tree.insert([1, 2, 3, 4, 5, 6, 7, 8, 9], list(range(8)) + [40])
    assert tree.num_tokens == 8 and tree.match([1, 2, 3, 4, 5, 6, 7, 8, 9]).length == 8
    tree.check_invariants()


def test_lock_protects_from_eviction():
    pool, tree, _ = make(num_pages=4)
    a, b = pool.alloc_pages(1), pool.alloc_pages(1)
    node_a = tree.insert([1, 2, 3, 4], pool.slots_of_pages(a))
    node_b = tree.insert([1, 2, 7, 8], pool.slots_of_pages(b))
    pool.release_pages(a + b)
    tree.lock(node_a)
    assert tree.evictable_pages_hint() == 1
    tree.reset()
    assert tree.match([1, 2, 3, 4]).length == 4 and tree.match([1, 2, 7, 8]).length == 2
    assert node_b.evicted and not node_a.evicted and pool.num_free_pages == 3
    assert tree.evict(4) == 3  # nothing unlocked left
    with pytest.raises(ValueError, match="was evicted"):
        tree.lock(node_b)
    tree.unlock(node_a)
    with pytest.raises(RuntimeError, match="unlock of an unlocked radix node at depth 4"):
        tree.unlock(node_a)
    assert tree.evictable_pages_hint() == 1
    assert tree.evict(4) == 4
    assert tree.num_nodes == 0 and tree.num_tokens == 0 and pool.num_free_pages == 4
    tree.check_invariants()
    pool.check_invariants()


def test_lru_eviction_order_with_injected_clock():
    evicted = []
    pool, tree, _ = make(num_pages=3, page_size=4,
                         on_evict=lambda n: evicted.append(path_tokens(n)))
    seqs = {"A": [1, 1, 1, 1], "B": [2, 2, 2, 2], "C": [3, 3, 3, 3]}
    for seq in seqs.values():
        pages = pool.alloc_pages(1)
        tree.insert(seq, pool.slots_of_pages(pages))
        pool.release_pages(pages)
    tree.match(seqs["A"])  # A becomes the most recent
    assert pool.num_free_pages == 0
    assert tree.evict(0) == 0 and evicted == []
    assert tree.evict(1) == 1 and evicted == [seqs["B"]]
    assert tree.evict(2) == 2 and evicted == [seqs["B"], seqs["C"]]
    assert tree.evict(3) == 3 and evicted == [seqs["B"], seqs["C"], seqs["A"]]


def test_parent_becomes_leaf_and_writer_held_pages_keep_evicting():
    evicted = []
    pool, tree, _ = make(num_pages=4, page_size=2, on_evict=lambda n: evicted.append(n.depth))
    held = pool.alloc_pages(1)  # slots 0, 1: the writer keeps this page
    mine = pool.alloc_pages(2)  # slots 2..5
    tree.insert([1, 2, 3, 4], [2, 3, 4, 5])
    tree.insert([9, 9], [0, 1])  # newest leaf, but its page stays held by the writer
    tree.insert([1, 2, 3, 4, 5, 6], [2, 3, 4, 5, 0, 1])  # child of [1..4], newest
    pool.release_pages(mine)
    tree.match([9, 9])  # [9, 9] most recent; [1..6] leaf older, then its parent [1..4]
    # 1 page free; reaching 3 needs both pages of [1..4]: the leaf [5, 6] frees nothing
    assert tree.evict(3) == 3
    assert evicted == [6, 4]
    assert tree.match([9, 9]).length == 2 and tree.match([1, 2]).length == 0
    assert pool.refcounts().tolist() == [3, 0, 0, 0]  # writer + the 2 slots of [9, 9]
    tree.check_invariants()


def test_on_evict_runs_before_decref_and_reset_returns_pages():
    seen = []
    pool, tree, _ = make(num_pages=8, page_size=4)

    def on_evict(node):
        seen.append((node.checkpoint, pool.refcounts()[node.slots[0] // 4]))
        node.checkpoint = None

    tree.on_evict = on_evict
    baseline = pool.num_free_pages
    for i, seq in enumerate(([1] * 6, [1] * 3 + [2] * 5, [4] * 9)):
        pages = pool.alloc_pages(pool.pages_for_tokens(len(seq)))
        node = tree.insert(seq, pool.slots_of_pages(pages)[: len(seq)])
        node.checkpoint = 100 + i
        pool.release_pages(pages)
    assert pool.num_free_pages < baseline
    assert tree.evictable_pages_hint() == baseline - pool.num_free_pages
    tree.reset()
    assert pool.num_free_pages == baseline and tree.num_nodes == 0
    assert sorted(c for c, _ in seen if c is not None) == [100, 101, 102]
    assert all(ref >= 1 for _, ref in seen)  # the page was still referenced at on_evict time
    pool.check_invariants()
    tree.check_invariants()


# --- randomized run against a brute-force reference --------------------------------------------
class Reference:
    """Stored tokens as {prefix tuple: [slot, last_access]} (prefix-closed) plus locked prefixes."""

    def __init__(self) -> None:
        self.store: dict[tuple, list] = {}
        self.locks: list[tuple] = []

    def match_len(self, seq) -> int:
        n = 0
        while n < len(seq) and tuple(seq[: n + 1]) in self.store:
            n += 1
        return n

    def touch(self, seq, n, now) -> None:
        for i in range(1, n + 1):
            self.store[tuple(seq[:i])][1] = now

    def insert(self, seq, slots, now) -> None:
        for i in range(len(seq)):
            self.store.setdefault(tuple(seq[: i + 1]), [int(slots[i]), now])[1] = now

    def lock_count(self, prefix) -> int:
        return sum(1 for p in self.locks if p[: len(prefix)] == prefix)


def tree_contents(tree) -> dict[tuple, tuple]:
    out, stack = {}, [(tree.root, ())]
    while stack:
        node, prefix = stack.pop()
        for child in node.children.values():
            p = prefix
            for tok, slot in zip(child.key, child.slots.tolist()):
                p = p + (tok,)
                out[p] = (slot, child.last_access, child.lock_ref)
            stack.append((child, p))
    return out


def check_against(tree, pool, ref, held) -> None:
    tree.check_invariants()
    pool.check_invariants()
    expected = {p: (s, t, ref.lock_count(p)) for p, (s, t) in ref.store.items()}
    assert tree_contents(tree) == expected
    counts = np.zeros(pool.num_pages, dtype=np.int64)
    for pages in held:
        counts[pages] += 1
    for slot, _ in ref.store.values():
        counts[slot // pool.page_size] += 1
    assert np.array_equal(pool.refcounts(), counts)
    assert tree.num_tokens == len(ref.store)


def checked_evict(tree, pool, ref, target) -> None:
    calls = []
    tree.on_evict = lambda n: calls.append((pool.num_free_pages, n.lock_ref, len(n.children),
                                            len(n.key)))
    before = dict(ref.store)
    free = tree.evict(target)
    tree.on_evict = None
    assert free == pool.num_free_pages
    contents = tree_contents(tree)
    assert set(contents) <= set(before)
    assert all(p[:-1] in contents for p in contents if len(p) > 1)
    removed = set(before) - set(contents)
    assert sum(c[3] for c in calls) == len(removed)
    for free_then, lock_ref, num_children, _ in calls:  # only needed, unlocked leaves went
        assert free_then < target and lock_ref == 0 and num_children == 0
    unlocked_leaves = [p for p in contents if ref.lock_count(p) == 0
                       and not any(q[:-1] == p for q in contents)]
    assert free >= target or not unlocked_leaves
    if removed and unlocked_leaves:  # least recently used first
        assert max(before[p][1] for p in removed) <= min(before[p][1] for p in unlocked_leaves)
    for p in removed:
        del ref.store[p]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_ops_match_brute_force_reference(seed):
    rng = np.random.default_rng(seed)
    pool, tree, clock = make(num_pages=40, page_size=3)
    ref, held, locked, bases = Reference(), [], [], [[]]

    def random_seq():
        base = bases[rng.integers(len(bases))]
        keep = int(rng.integers(0, len(base) + 1))
        extra = rng.integers(0, 4, size=int(rng.integers(0 if keep else 1, 12))).tolist()
        return (base[:keep] + extra)[:24]

    ops = ["insert"] * 7 + ["match"] * 5 + ["lock", "unlock", "unlock", "release", "release",
                                            "evict", "node_at"]
    for step in range(1200):
        op = "reset" if step % 300 == 299 else ops[rng.integers(len(ops))]
        seq = random_seq()
        if op == "insert":
            need = pool.pages_for_tokens(len(seq))
            if pool.num_free_pages < need:
                checked_evict(tree, pool, ref, need)
            try:
                pages = pool.alloc_pages(need)
            except OutOfPages:
                pages = None
            if pages is not None:
                slots = pool.slots_of_pages(pages)[: len(seq)]
                node = tree.insert(seq, slots)
                assert node.depth == len(seq) and path_tokens(node) == seq
                ref.insert(seq, slots, clock.now)
                bases.append(seq)
                if rng.random() < 0.7:
                    pool.release_pages(pages)
                else:
                    held.append(pages)
        elif op in ("match", "lock"):
            m = tree.match(seq)
            n = ref.match_len(seq)
            assert m.length == n and m.node.depth == n and path_tokens(m.node) == seq[:n]
            assert m.slots.tolist() == [ref.store[tuple(seq[: i + 1])][0] for i in range(n)]
            ref.touch(seq, n, clock.now)
            if op == "lock" and n:
                tree.lock(m.node)
                locked.append(m.node)
                ref.locks.append(tuple(seq[:n]))
        elif op == "unlock" and locked:
            i = int(rng.integers(len(locked)))
            tree.unlock(locked.pop(i))
            ref.locks.pop(i)
        elif op == "release" and held:
            pool.release_pages(held.pop(int(rng.integers(len(held)))))
        elif op == "evict":
            checked_evict(tree, pool, ref, int(rng.integers(0, pool.num_pages + 1)))
        elif op == "node_at":
            depth = int(rng.integers(0, len(seq) + 1))
            node = tree.node_at(seq, depth)
            if ref.match_len(seq) < depth:
                assert node is None
            else:
                assert node.depth == depth and path_tokens(node) == seq[:depth]
        elif op == "reset":
            checked_evict(tree, pool, ref, pool.num_pages + 1)
        check_against(tree, pool, ref, held)
    for node in locked:
        tree.unlock(node)
    for pages in held:
        pool.release_pages(pages)
    tree.reset()
    assert pool.num_free_pages == pool.num_pages and tree.num_nodes == 0
    tree.check_invariants()
    pool.check_invariants()


def test_40k_token_prompt_insert_and_match_is_fast():
    n = 40_000
    pool = KVPagePool(LAYOUT, num_pages=4000, page_size=16, device="cpu")
    tree = RadixTree(pool)
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, 151_000, size=n)
    start = time.perf_counter()
    pages = pool.alloc_pages(pool.pages_for_tokens(n))
    slots = pool.slots_of_pages(pages)
    leaf = tree.insert(tokens.tolist(), slots)
    m = tree.match(tokens)
    assert m.length == n and m.node is leaf and np.array_equal(m.slots, slots)
    fork = tokens.copy()
    fork[30_000] = 151_001  # not in the vocabulary range drawn above: diverges there
    m = tree.match(fork)
    assert m.length == 30_000 and m.node.depth == 30_000
    assert np.array_equal(m.slots, slots[:30_000])
    more = pool.alloc_pages(pool.pages_for_tokens(n - 30_000))
    fork_slots = np.concatenate([slots[:30_000], pool.slots_of_pages(more)[: n - 30_000]])
    node = tree.insert(fork, fork_slots)
    assert node.depth == n and tree.num_tokens == n + 10_000
    assert tree.match(list(itertools.chain(fork[:35_000].tolist(), [5]))).length == 35_000
    tree.check_invariants()
    pool.release_pages(pages + more)
    tree.reset()
    assert pool.num_free_pages == pool.num_pages
    assert time.perf_counter() - start < 3.0
