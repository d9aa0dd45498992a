"""A stand-in radix node for the checkpoint-store and retention tests."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(eq=False)
class Node:
    """Stand-in for RadixNode: only the attributes the store and the retention rule read."""

    parent: Node | None = None
    children: dict[int, Node] = field(default_factory=dict)
    depth: int = 0
    lock_ref: int = 0
    checkpoint: int | None = None
