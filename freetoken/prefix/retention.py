"""Which recurrent-state checkpoint to give up when the store is full: value first, then age.

A global LRU pool loses on interleaved agent threads (checkpoint-policy-sim.md finding 2): the
checkpoints a returning thread needs are the deepest ones on its path, and plain LRU evicts them
while another thread fills the pool. Here a checkpoint is *redundant* (class 0) when every
root-to-leaf path through its radix node already has ``keep_deepest`` checkpoints deeper than it
and its node is not a branch point (two or more children: conversations diverged there, e.g.
sub-agents sharing a system prompt): a future request on any of those paths resumes from a deeper
one. Redundant checkpoints go first, then the rest; within a class the checkpoint with the
smallest *gain* goes first (tokens it saves over the next shallower checkpoint on its path, so
the survivors stay spread along the path and a lost one costs little), then the oldest.
A running request locks its whole radix path, but only the checkpoint its lock ends at (the one it
restores or its latest snapshot) is protected, going only when nothing else is left: the shallower
ones on its path were needed only until the request had restored its state (a cold prefill with
many anchors would otherwise evict every other conversation's checkpoints before its own).
Paper §3.1; tuned on ``evals/bench_prefix.py`` (interleaved Claude Code sessions).

Only these node attributes are read: ``children`` (dict of child nodes), ``checkpoint``
(id or None), ``lock_ref`` (int), ``parent`` and ``depth`` (the gain).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any


def deeper_checkpoint_counts(roots: Sequence[Any]) -> dict[int, int]:
    """For each node in the subtrees of ``roots``: the fewest checkpoints strictly below it on any
    path from it down to a leaf.

    ``f(leaf) = 0``; ``f(n) = min over children c of f(c) + (1 if c.checkpoint is not None)``.
    Iterative post-order walk (radix trees can be deeper than Python's recursion limit); each node
    is visited once even when several roots share a subtree.

    Returns:
        ``{id(node): f(node)}`` for every node visited.
    """
    counts: dict[int, int] = {}
    for root in roots:
        if id(root) in counts:
            continue
        stack: list[tuple[Any, bool]] = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if id(node) in counts:
                continue
            children = list(node.children.values())
            if not expanded and children:
                stack.append((node, True))
                stack.extend((c, False) for c in children if id(c) not in counts)
                continue
            counts[id(node)] = min(
                (counts[id(c)] + (c.checkpoint is not None) for c in children), default=0
            )
    return counts


def is_redundant(node: Any, keep_deepest: int, counts: dict[int, int] | None = None) -> bool:
    """The depth part of the class 0 test: every path from ``node`` down to a leaf has
    >= ``keep_deepest`` checkpoints deeper than ``node`` (:func:`pick_victim` also exempts
    branch points, nodes with two or more children).

    Args:
        node: a radix node.
        keep_deepest: checkpoints kept per path (0: every node passes).
        counts: precomputed :func:`deeper_checkpoint_counts` covering ``node`` (computed if None).
    """
    if counts is None or id(node) not in counts:
        counts = deeper_checkpoint_counts([node])
    return counts[id(node)] >= keep_deepest


def pick_victim(candidates: Sequence[tuple[Hashable, Any, float]], keep_deepest: int) -> Hashable:
    """The checkpoint to drop (or spill) first.

    Order: unprotected before protected (a running request's lock ends at the node), then class 0 (redundant, see module
    docstring) before class 1, then the smallest gain, then oldest ``last_use`` first, then the
    candidate listed first.

    Args:
        candidates: ``(cid, node, last_use)`` triples; ``last_use`` in the store's clock units
            (seconds of ``time.monotonic`` by default).
        keep_deepest: checkpoints kept per root-to-leaf path, >= 0.

    Returns:
        The chosen ``cid``.

    Raises:
        ValueError: no candidates, or ``keep_deepest < 0``.
    """
    if keep_deepest < 0:
        raise ValueError(f"keep_deepest must be >= 0, got {keep_deepest}")
    if not candidates:
        raise ValueError("pick_victim needs at least one candidate checkpoint")
    counts = deeper_checkpoint_counts([node for _, node, _ in candidates])

    def key(item: tuple[int, tuple[Hashable, Any, float]]) -> tuple:
        index, (_, node, last_use) = item
        locked = _lock_end(node)
        branch = len(node.children) > 1
        value_class = 0 if counts[id(node)] >= keep_deepest and not branch else 1
        gain = _gain(node)
        return (locked, value_class, gain, last_use, index)

    return min(enumerate(candidates), key=key)[1][0]


def _gain(node: Any) -> int:
    """Tokens a checkpoint saves over the next shallower one on its path (its depth when none)."""
    depth = getattr(node, "depth", 0)
    up = getattr(node, "parent", None)
    while up is not None and up.checkpoint is None:
        up = up.parent
    return depth - (getattr(up, "depth", 0) if up is not None else 0)


def _lock_end(node: Any) -> bool:
    """True when a running request's lock ends at ``node`` (its restore point or latest
    checkpoint): more locks reach it than continue into its children. Shallower checkpoints on a
    running request's path are not protected: the request restored its state already."""
    below = sum(getattr(c, "lock_ref", 0) for c in node.children.values())
    return node.lock_ref > below
