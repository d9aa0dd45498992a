"""Token-granular radix tree over KV token slots (paper §3.1, prefix reuse).

Each edge holds a run of token ids and the KV token slots (:mod:`freetoken.prefix.kv_pool`) that
hold their keys and values. A request's prompt is matched against the tree to find its longest
cached prefix; a finished (or aborted) request inserts its tokens so later requests can reuse
them. The tree holds one pool ref per stored token slot; eviction drops least-recently-used
unlocked leaves and gives their refs back to the pool. A node may carry the id of a recurrent-state
checkpoint taken at its end depth (hybrid models: the Gated DeltaNet state after that prefix).

The idea follows SGLang's RadixCache (token-level radix tree with LRU leaf eviction and lock
refs); the code is our own.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from freetoken.prefix.kv_pool import KVPagePool, as_slot_array

_EMPTY = np.zeros(0, dtype=np.int64)
_EMPTY.flags.writeable = False


class RadixNode:
    """One edge of the tree and the node at its end.

    Attributes:
        parent: the node above (None for the root and for evicted nodes).
        children: child nodes keyed by the first token of their key.
        key: tokens on the edge into this node (empty for the root).
        slots: int64 ``[len(key)]`` KV token slots of those tokens (read-only array).
        depth: tokens from the root to the END of this node.
        lock_ref: > 0 while a running request uses this path (never evicted then).
        last_access: clock value of the last match/insert/touch that covered this node.
        checkpoint: id of the recurrent-state checkpoint taken at depth ``depth``, or None.
        evicted: True once the tree dropped this node.
    """

    __slots__ = ("parent", "children", "key", "slots", "depth", "lock_ref", "last_access",
                 "checkpoint", "evicted", "_tokens")

    def __init__(self, parent: RadixNode | None, tokens: np.ndarray, slots: np.ndarray,
                 depth: int, last_access: float) -> None:
        self.parent = parent
        self.children: dict[int, RadixNode] = {}
        self._set_edge(tokens, slots)
        self.depth = depth
        self.lock_ref = 0
        self.last_access = last_access
        self.checkpoint: int | None = None
        self.evicted = False

    def _set_edge(self, tokens: np.ndarray, slots: np.ndarray) -> None:
        """Store the edge as read-only int64 arrays (``_tokens``, ``slots``) and a ``key`` tuple."""
        tokens = tokens.view()
        tokens.flags.writeable = False
        slots = slots.view()
        slots.flags.writeable = False
        self._tokens = tokens
        self.slots = slots
        self.key = tuple(tokens.tolist())

    def __repr__(self) -> str:
        head = list(self.key[:4]) + (["..."] if len(self.key) > 4 else [])
        return (f"RadixNode(depth={self.depth}, key={head}, lock_ref={self.lock_ref}, "
                f"checkpoint={self.checkpoint}, children={len(self.children)})")


@dataclass(frozen=True, eq=False)
class PrefixMatch:
    """Result of :meth:`RadixTree.match`.

    Attributes:
        length: tokens matched (longest common prefix of the query with the tree).
        slots: int64 ``[length]`` KV token slots of the matched tokens (a fresh array).
        node: the node with ``node.depth == length`` (an edge is split when the match ends
            inside it); the root when ``length == 0``.
    """

    length: int
    slots: np.ndarray
    node: RadixNode


def as_token_array(tokens) -> np.ndarray:
    """Token ids as a 1-D int64 numpy array.

    Args:
        tokens: list/tuple of ints, numpy integer array or torch integer tensor, 1-D.

    Raises:
        TypeError: non-integer ids.
        ValueError: not 1-D.
    """
    if isinstance(tokens, torch.Tensor):
        if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
            raise TypeError(f"token ids must be integers, got a {tokens.dtype} tensor")
        arr = tokens.detach().to("cpu", torch.int64).numpy()
    else:
        arr = np.asarray(tokens)
        if arr.size == 0:
            arr = arr.astype(np.int64)
        elif arr.dtype.kind not in "iu":
            raise TypeError(f"token ids must be integers, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"token ids must be 1-D, got shape {tuple(arr.shape)}")
    return arr.astype(np.int64, copy=False)


def _common_len(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two int64 arrays."""
    n = min(a.size, b.size)
    if n <= 8:
        for i in range(n):
            if a[i] != b[i]:
                return i
        return n
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


class RadixTree:
    """Radix tree of token ids -> KV token slots with lock refs and LRU leaf eviction.

    Args:
        pool: the :class:`KVPagePool` whose token slots the tree stores (one ref per slot).
        on_evict: called with each node right before the tree drops it and decrefs its slots
            (the checkpoint store drops ``node.checkpoint`` there).
        clock: monotonic clock for ``last_access`` (injectable for tests).

    Attributes:
        root: the empty-key root (depth 0, never evicted).
        num_tokens: tokens stored (sum of edge lengths).
        num_nodes: nodes besides the root.
    """

    def __init__(self, pool: KVPagePool, on_evict: Callable[[RadixNode], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.pool = pool
        self.on_evict = on_evict
        self.clock = clock
        self.root = RadixNode(None, _EMPTY, _EMPTY, 0, clock())
        self.num_tokens = 0
        self.num_nodes = 0

    # --- lookup ----------------------------------------------------------------------------
    def match(self, tokens: Sequence[int]) -> PrefixMatch:
        """Longest cached prefix of ``tokens``; refreshes ``last_access`` on the matched path.

        Args:
            tokens: token ids (see :func:`as_token_array`).

        Returns:
            :class:`PrefixMatch`; its ``node`` has depth exactly ``length`` (an edge is split when
            the match ends inside it).

        Raises:
            TypeError, ValueError: bad token ids (:func:`as_token_array`).
        """
        ids = as_token_array(tokens)
        now = self.clock()
        node, pos, parts = self._walk(ids, ids.size, now)
        slots = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        return PrefixMatch(pos, slots, node)

    def peek(self, tokens: Sequence[int]) -> tuple[int, list[RadixNode]]:
        """Longest cached prefix of ``tokens`` without changing the tree (no edge split, no
        ``last_access`` refresh): for reporting.

        Returns:
            (matched length in tokens, the nodes on the path whose edge is fully matched, root
            excluded, shallowest first).

        Raises:
            TypeError, ValueError: bad token ids (:func:`as_token_array`).
        """
        ids = as_token_array(tokens)
        node, pos, path = self.root, 0, []
        while pos < ids.size:
            child = node.children.get(int(ids[pos]))
            if child is None:
                break
            n = _common_len(child._tokens, ids[pos:])
            pos += n
            if n < child._tokens.size:
                break
            path.append(child)
            node = child
        return pos, path

    def node_at(self, tokens: Sequence[int], depth: int) -> RadixNode | None:
        """The node of depth ``depth`` on the path of ``tokens`` (an edge is split if needed).

        Does not refresh ``last_access``.

        Returns:
            the node, the root for ``depth == 0``, or None when the tree holds fewer than
            ``depth`` tokens of that path.

        Raises:
            ValueError: ``depth`` outside ``[0, len(tokens)]``; bad token ids.
        """
        ids = as_token_array(tokens)
        if not 0 <= depth <= ids.size:
            raise ValueError(f"depth {depth} outside [0, {ids.size}] for {ids.size} tokens")
        node, pos, _ = self._walk(ids, depth, None, split_short=False)
        return node if pos == depth else None

    def _walk(self, ids: np.ndarray, limit: int, now: float | None, split_short: bool = True
              ) -> tuple[RadixNode, int, list[np.ndarray]]:
        """Follow ``ids[:limit]`` down from the root, splitting the last edge when the walk ends
        inside it (with ``split_short`` False only when it ends there at ``limit``, not at a
        mismatch). Returns (deepest node reached, its depth, slot arrays of the path). ``now``
        (if not None) becomes ``last_access`` of every node on the path."""
        node, pos, parts = self.root, 0, []
        while pos < limit:
            child = node.children.get(int(ids[pos]))
            if child is None:
                break
            n = _common_len(child._tokens, ids[pos:limit])
            inside = n < child._tokens.size
            if inside and not split_short and pos + n < limit:
                break
            if inside:
                child = self._split(child, n)
            if now is not None:
                child.last_access = now
            parts.append(child.slots)
            node, pos = child, pos + n
            if inside:
                break
        return node, pos, parts

    # --- insertion -------------------------------------------------------------------------
    def insert(self, tokens: Sequence[int], slots) -> RadixNode:
        """Store ``tokens`` with their KV token slots.

        For the part already in the tree the existing slots win and nothing is incref'd; the
        newly stored slots get one pool ref each. Refreshes ``last_access`` on the path.

        Args:
            tokens: token ids ``[n]``.
            slots: KV token slots ``[n]`` (list/numpy/torch integers) holding those tokens' K/V.

        Returns:
            the node with ``depth == len(tokens)`` (the root for no tokens).

        Raises:
            ValueError: ``len(slots) != len(tokens)``, a slot outside the pool, bad token ids.
            RuntimeError: a new slot on a free pool page (see :meth:`KVPagePool.incref`); the
                tree then holds no ref to it.
        """
        ids = as_token_array(tokens)
        slot_arr = as_slot_array(slots)
        if slot_arr.size != ids.size:
            raise ValueError(f"insert got {ids.size} tokens but {slot_arr.size} slots")
        now = self.clock()
        node, pos, _ = self._walk(ids, ids.size, now)
        if pos == ids.size:
            return node
        new_slots = slot_arr[pos:].copy()
        self.pool.incref(new_slots)
        leaf = RadixNode(node, ids[pos:].copy(), new_slots, ids.size, now)
        node.children[int(ids[pos])] = leaf
        self.num_tokens += leaf.slots.size
        self.num_nodes += 1
        return leaf

    def _split(self, node: RadixNode, n: int) -> RadixNode:
        """Split ``node``'s edge after ``n`` tokens (0 < n < len(key)); returns the new upper
        node. ``node`` keeps its identity, depth and checkpoint (the lower half); the upper node
        copies ``lock_ref`` and ``last_access``."""
        parent = node.parent
        upper = RadixNode(parent, node._tokens[:n], node.slots[:n],
                          node.depth - node._tokens.size + n, node.last_access)
        upper.lock_ref = node.lock_ref
        parent.children[int(node._tokens[0])] = upper
        node._set_edge(node._tokens[n:], node.slots[n:])
        node.parent = upper
        upper.children[int(node._tokens[0])] = node
        self.num_nodes += 1
        return upper

    # --- locking ---------------------------------------------------------------------------
    def lock(self, node: RadixNode) -> None:
        """+1 ``lock_ref`` on ``node`` and every ancestor (root excluded): the path is in use.

        Raises:
            ValueError: ``node`` was evicted.
        """
        self._check_live(node)
        while node is not self.root:
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        """-1 ``lock_ref`` on ``node`` and every ancestor (root excluded).

        Raises:
            ValueError: ``node`` was evicted.
            RuntimeError: ``node`` is not locked (unbalanced unlock); nothing is changed.
        """
        self._check_live(node)
        if node is not self.root and node.lock_ref <= 0:
            raise RuntimeError(f"unlock of an unlocked radix node at depth {node.depth}")
        while node is not self.root:
            node.lock_ref -= 1
            node = node.parent

    def touch(self, node: RadixNode) -> None:
        """Refresh ``last_access`` of ``node`` and its ancestors to now.

        Raises:
            ValueError: ``node`` was evicted.
        """
        self._check_live(node)
        now = self.clock()
        while node is not None:
            node.last_access = now
            node = node.parent

    def _check_live(self, node: RadixNode) -> None:
        if node.evicted:
            raise ValueError(f"radix node at depth {node.depth} was evicted")

    # --- eviction --------------------------------------------------------------------------
    def evict(self, num_pages: int) -> int:
        """Drop least-recently-used unlocked leaves until the pool has ``num_pages`` free pages.

        A parent whose last child goes becomes a leaf and a candidate too. For each dropped node:
        ``on_evict(node)`` first, then ``pool.decref(node.slots)``. Pages still held by a writer
        or by another node's slots are not freed by it, so more nodes may go.

        Returns:
            free pages in the pool afterwards (< ``num_pages`` when nothing evictable is left).
        """
        return self._evict(num_pages)

    def reset(self) -> None:
        """Evict every unlocked node (locked paths stay)."""
        self._evict(None)

    def _evict(self, num_pages: int | None) -> int:
        pool = self.pool
        if num_pages is not None and pool.num_free_pages >= num_pages:
            return pool.num_free_pages
        order = itertools.count()
        heap = [(leaf.last_access, next(order), leaf) for leaf in self.leaves()
                if leaf.lock_ref == 0]
        heapq.heapify(heap)
        while heap and (num_pages is None or pool.num_free_pages < num_pages):
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            if self.on_evict is not None:
                self.on_evict(node)
            pool.decref(node.slots)
            del parent.children[int(node._tokens[0])]
            node.parent = None
            node.evicted = True
            self.num_tokens -= node.slots.size
            self.num_nodes -= 1
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, next(order), parent))
        return pool.num_free_pages

    def evictable_pages_hint(self) -> int:
        """Pages that evicting every unlocked node would free right now (pages whose every ref
        is a tree ref of an unlocked node)."""
        parts = [n.slots for n in self._nodes() if n.lock_ref == 0]
        if not parts:
            return 0
        pages = np.concatenate(parts) // self.pool.page_size
        uniq, counts = np.unique(pages, return_counts=True)
        return int(np.count_nonzero(self.pool.refcounts()[uniq] == counts))

    # --- inspection ------------------------------------------------------------------------
    def leaves(self) -> list[RadixNode]:
        """Nodes without children, root excluded (depth-first order)."""
        return [n for n in self._nodes() if not n.children]

    def _nodes(self) -> list[RadixNode]:
        """All nodes except the root, depth-first."""
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def check_invariants(self) -> None:
        """Raise AssertionError unless every node's depth, key/slot lengths, child keys, parent
        links and lock counts are consistent and the token/node counters match the tree."""
        root = self.root
        assert root.depth == 0 and not root.key and root.parent is None, "bad root"
        tokens = nodes = 0
        stack = [root]
        while stack:
            node = stack.pop()
            child_locks = 0
            for first, child in node.children.items():
                assert not child.evicted, "evicted node still linked"
                assert child.parent is node, "child's parent link is wrong"
                assert len(child.key) >= 1, "empty edge below the root"
                assert child.key[0] == first, "child keyed by a token other than its first"
                assert child._tokens.tolist() == list(child.key), "key and token array differ"
                assert child.slots.shape == (len(child.key),), "slots do not match the key"
                assert child.slots.dtype == np.int64, "slots are not int64"
                assert child.depth == node.depth + len(child.key), "wrong depth"
                assert child.lock_ref >= 0, "negative lock_ref"
                child_locks += child.lock_ref
                tokens += len(child.key)
                nodes += 1
                stack.append(child)
            if node is not root:
                assert node.lock_ref >= child_locks, "lock_ref below its children's locks"
        assert tokens == self.num_tokens, f"num_tokens {self.num_tokens} != {tokens}"
        assert nodes == self.num_nodes, f"num_nodes {self.num_nodes} != {nodes}"
