"""The prefix cache: KV page pool + radix tree + recurrent-state checkpoints + anchors, per request.

Paper §3.1. The scheduler calls it (engine thread only):

* :meth:`PrefixCache.admit` on admission: longest-prefix match of the request's known ids in the
  radix tree; the reusable length is the match itself for attention-only models and the depth of
  the deepest recurrent-state checkpoint at or before it for hybrid models (a Gated DeltaNet state
  cannot be partially reused). The reused path is locked against eviction, and KV slots for the
  rest of the prompt are allocated at once (admission by memory: all or nothing, evicting
  unreferenced radix leaves when the pool is short).
* :meth:`PrefixCache.slots` hands out the KV slots of each scheduled chunk (decode steps allocate
  a page when the last one is full).
* :meth:`PrefixCache.checkpoint` after a chunk that ends on an anchor: the computed prefix is
  inserted into the tree and the live recurrent state is copied into a checkpoint attached to the
  node at that depth; the request's lock moves down to it.
* :meth:`PrefixCache.release` when a request finishes, is aborted or preempted: its computed
  ids stay in the tree (with a tail checkpoint when the live state is given), the lock and the
  request's own page references are dropped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from freetoken.prefix.anchors import AnchorKind, AnchorMarkers, AnchorPolicy, find_anchors
from freetoken.prefix.checkpoints import CheckpointStore, RecurrentLayout
from freetoken.prefix.defaults import (  # noqa: F401 - re-exported
    DEFAULT_CHECKPOINT_HOST_BYTES,
    DEFAULT_CHECKPOINT_SLOTS,
    DEFAULT_PAGE_SIZE,
)
from freetoken.prefix.kv_pool import KVLayout, KVPagePool, OutOfPages
from freetoken.prefix.radix import RadixNode, RadixTree



@dataclass(frozen=True)
class PrefixConfig:
    """Sizes and policy of the prefix cache.

    Attributes:
        num_pages: KV pages in the pool (each ``page_size`` tokens of every attention layer).
        page_size: tokens per KV page (``--page-size``).
        checkpoint_slots: device-tier recurrent-state checkpoint slots (``--state-checkpoint-slots``).
        checkpoint_host_bytes: host-tier byte budget for spilled checkpoints
            (``--state-checkpoint-bytes``).
        anchors: block kinds that get a checkpoint (default turn starts, generation start and
            generation end).
        reuse: False disables prefix matching (every request is computed from position 0); the
            KV stays paged.
        checkpoint_interval: also checkpoint every this many tokens of a prompt (a fixed grid,
            the baseline policy of ``evals/bench_prefix.py``); 0 turns the grid off.

    Raises:
        ValueError: a size is negative / not positive.
    """

    num_pages: int
    page_size: int = DEFAULT_PAGE_SIZE
    checkpoint_slots: int = DEFAULT_CHECKPOINT_SLOTS
    checkpoint_host_bytes: int = DEFAULT_CHECKPOINT_HOST_BYTES
    anchors: AnchorPolicy = field(default_factory=AnchorPolicy.default)
    reuse: bool = True
    checkpoint_interval: int = 0

    def __post_init__(self) -> None:
        if self.checkpoint_interval < 0:
            raise ValueError(f"checkpoint_interval must be >= 0, got {self.checkpoint_interval}")
        if self.num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {self.num_pages}")
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if self.checkpoint_slots < 0 or self.checkpoint_host_bytes < 0:
            raise ValueError("checkpoint capacities must be >= 0")


def pages_for_tokens(num_tokens: int, page_size: int) -> int:
    """Pages needed for ``num_tokens`` tokens (ceil)."""
    return -(-num_tokens // page_size)


@dataclass(frozen=True)
class Reuse:
    """What a newly admitted request starts from.

    Attributes:
        length: ids reused (KV and recurrent state both valid up to here).
        slots: KV slots of positions ``[0, length)``.
        checkpoint: recurrent-state checkpoint id to restore, or None (attention-only model or
            ``length == 0``).
        matched: the longest common prefix with the tree (``>= length``).
    """

    length: int
    slots: tuple[int, ...]
    checkpoint: int | None
    matched: int


@dataclass
class _Seq:
    slots: list[int]                      # KV slots of positions [0, len(slots))
    pages: list[int] = field(default_factory=list)   # pages this request allocated (writer refs)
    spare: list[int] = field(default_factory=list)   # unused slots of its last page
    node: RadixNode | None = None         # locked radix node
    boundaries: list[int] = field(default_factory=list)  # checkpoint positions still ahead
    anchors: AnchorPolicy | None = None   # this request's anchor policy


class PrefixCache:
    """Paged KV pool, radix tree and checkpoint store shared by all requests.

    Args:
        config: sizes and anchor policy.
        kv_layout: the model's attention KV shape (``DecoderLM.kv_layout()``).
        recurrent_layout: the model's recurrent-state tensors (``DecoderLM.recurrent_layout()``);
            empty for attention-only models (no checkpoints are kept).
        markers: block-opening token ids of the tokenizer (anchors); None places only
            generation start/end anchors.
        device: where KV pages and device-tier checkpoints live.
    """

    def __init__(self, config: PrefixConfig, kv_layout: KVLayout,
                 recurrent_layout: RecurrentLayout, markers: AnchorMarkers | None,
                 device: torch.device | str | None = None) -> None:
        self.config = config
        self.markers = markers
        self.hybrid = bool(recurrent_layout.shapes)
        self.pool = KVPagePool(kv_layout, config.num_pages, config.page_size, device)
        self.store: CheckpointStore | None = None
        if self.hybrid:
            self.store = CheckpointStore(recurrent_layout, config.checkpoint_slots,
                                         config.checkpoint_host_bytes, device)
        on_evict = self.store.on_node_evicted if self.store is not None else None
        self.tree = RadixTree(self.pool, on_evict=on_evict)
        self._seqs: dict[int, _Seq] = {}

    # ------------------------------------------------------------------ admission
    def admit(self, key: int, token_ids: Sequence[int], num_prompt: int,
              anchors: AnchorPolicy | None = None) -> Reuse:
        """Match ``token_ids`` (prompt + output known so far), lock the reused path and allocate
        KV slots for the rest of the prompt.

        Args:
            key: the request's engine key (must not be admitted already).
            token_ids: every known id of the request (at least one).
            num_prompt: how many of them are prompt ids (anchors are placed in the prompt).
            anchors: this request's anchor policy (a harness adapter's, per session); None uses
                the configured default.

        Returns:
            The reuse decision (at least one id is always left to compute, so the last
            position's logits exist).

        Raises:
            OutOfPages: the pool cannot hold the rest of the ids even after evicting every
                unreferenced radix leaf (nothing is held then; retry after other requests end).
            ValueError: ``key`` already admitted.
        """
        if key in self._seqs:
            raise ValueError(f"request {key} is already admitted")
        n = len(token_ids)
        length, slots, cid, node, matched = 0, (), None, self.tree.root, 0
        if self.config.reuse and n > 1:
            match = self.tree.match(token_ids[: n - 1])
            matched, node = match.length, match.node
            if self.hybrid:
                while node.parent is not None and node.checkpoint is None:
                    node = node.parent
                cid = node.checkpoint
                self._touch_path(node)
            length = node.depth
            slots = tuple(int(s) for s in match.slots[:length])
        seq = _Seq(list(slots))
        seq.node = node if node is not self.tree.root else None
        if seq.node is not None:
            self.tree.lock(seq.node)
        self._seqs[key] = seq
        try:
            self._grow(seq, n - length)
        except OutOfPages:
            self._drop(key, seq)
            raise
        seq.anchors = anchors or self.config.anchors
        seq.boundaries = self._boundaries(token_ids[:num_prompt], length, seq.anchors)
        return Reuse(length, slots, cid, matched)

    def _touch_path(self, node: RadixNode) -> None:
        """Mark every checkpoint on the root path of ``node`` as used now: a returning
        conversation keeps its whole path warm, not only the checkpoint it restores."""
        while node is not None and self.store is not None:
            if node.checkpoint is not None:
                self.store.touch(node.checkpoint)
            node = node.parent

    def _boundaries(self, prompt: Sequence[int], start: int,
                    policy: AnchorPolicy) -> list[int]:
        if not self.hybrid:
            return []
        marks = self.markers if self.markers is not None else AnchorMarkers.empty()
        positions = {a.position for a in find_anchors(prompt, marks, policy)}
        if AnchorKind.GENERATION_START in policy.kinds and len(prompt) >= 2:
            # also one token earlier: the generation prompt's last token (``<think>\n``) often
            # tokenises differently once the reply follows it, and an identical prompt needs
            # its last token's logits recomputed
            positions.add(len(prompt) - 1)
            # and before the generation prompt's thinking opener (``<|im_start|>assistant\n``
            # then ``<think>``): the next turn renders the recorded reply right after the role
            # header, so a resent conversation matches up to that marker
            opener = self._generation_thinking_start(prompt, marks)
            if opener is not None:
                positions.add(opener)
        if self.config.checkpoint_interval:
            positions.update(range(self.config.checkpoint_interval, len(prompt),
                                   self.config.checkpoint_interval))
        return sorted(p for p in positions if p > start)

    @staticmethod
    def _generation_thinking_start(prompt: Sequence[int], marks: AnchorMarkers) -> int | None:
        """Index of a thinking-start marker after the prompt's last turn-start marker (the
        generation prompt), or None."""
        think, turn = marks.ids_of(AnchorKind.THINKING_START), marks.ids_of(AnchorKind.TURN_START)
        if not think or not turn:
            return None
        for i in range(len(prompt) - 1, 0, -1):
            token = int(prompt[i])
            if token in think:
                return i
            if token in turn:
                return None
        return None

    def boundaries_in(self, key: int, start: int, stop: int) -> tuple[int, ...]:
        """Checkpoint positions ``p`` of request ``key`` with ``start < p <= stop`` (each is
        handed out once; positions up to ``start`` are dropped)."""
        seq = self._seqs[key]
        while seq.boundaries and seq.boundaries[0] <= start:
            seq.boundaries.pop(0)
        out = []
        while seq.boundaries and seq.boundaries[0] <= stop:
            out.append(seq.boundaries.pop(0))
        return tuple(out)

    def wants_generation_end(self, key: int | None = None) -> bool:
        """True when finished request ``key`` (None: a request with the default policy) gets a
        generation-end checkpoint (hybrid models) or its last sampled token's KV
        (attention-only models)."""
        seq = self._seqs.get(key) if key is not None else None
        policy = seq.anchors if seq is not None else self.config.anchors
        return self.config.reuse and AnchorKind.GENERATION_END in policy.kinds

    # ------------------------------------------------------------------ KV slots
    def _grow(self, seq: _Seq, n: int) -> None:
        short = n - len(seq.spare)
        if short > 0:
            pages_needed = pages_for_tokens(short, self.config.page_size)
            if self.pool.num_free_pages < pages_needed:
                self.tree.evict(pages_needed)
            pages = self.pool.alloc_pages(pages_needed)  # raises OutOfPages
            seq.pages.extend(pages)
            for page in pages:
                seq.spare.extend(self.pool.page_slots(page))
        seq.slots.extend(seq.spare[:n])
        del seq.spare[:n]

    def slots(self, key: int, start: int, stop: int) -> tuple[int, ...]:
        """KV slots of positions ``[start, stop)`` of request ``key``, allocating what is missing.

        Raises:
            OutOfPages: a page was needed and none could be freed.
        """
        seq = self._seqs[key]
        if stop > len(seq.slots):
            self._grow(seq, stop - len(seq.slots))
        return tuple(seq.slots[start:stop])

    def can_hold(self, num_tokens: int) -> bool:
        """True when the pool could ever hold a sequence of ``num_tokens`` ids."""
        return pages_for_tokens(num_tokens, self.config.page_size) <= self.pool.num_pages

    # ------------------------------------------------------------------ checkpoints
    def checkpoint(self, key: int, token_ids: Sequence[int], depth: int,
                   tensors: Sequence[torch.Tensor] | None) -> int | None:
        """Insert ``token_ids[:depth]`` into the tree and checkpoint the live recurrent state there.

        Args:
            key: the request.
            token_ids: its known ids (at least ``depth``).
            depth: ids consumed by the state ``tensors`` describe.
            tensors: ``DecoderLM.recurrent_tensors(state)`` (live references; copied), or None
                to insert the KV only.

        Returns:
            The checkpoint id, or None when no checkpoint was stored.
        """
        seq = self._seqs[key]
        if not self.config.reuse or depth < 1:
            return None
        node = self.tree.insert(token_ids[:depth], seq.slots[:depth])
        self._relock(seq, node)
        if self.store is None or tensors is None:
            return None
        return self.store.save(tensors, node)

    def _relock(self, seq: _Seq, node: RadixNode) -> None:
        self.tree.lock(node)
        if seq.node is not None:
            self.tree.unlock(seq.node)
        seq.node = node

    # ------------------------------------------------------------------ release
    def release(self, key: int, token_ids: Sequence[int], computed: int,
                tensors: Sequence[torch.Tensor] | None = None) -> None:
        """A request leaves (finished, aborted, failed or preempted).

        Its first ``computed`` ids (their KV) stay in the tree, with a checkpoint of the live
        recurrent state at ``computed`` when ``tensors`` is given; then its lock and own page
        references are dropped. A no-op for an unknown key.
        """
        seq = self._seqs.get(key)
        if seq is None:
            return
        if self.config.reuse and computed > 0:
            self.checkpoint(key, token_ids, computed, tensors)
        self._drop(key, seq)

    def _drop(self, key: int, seq: _Seq) -> None:
        if seq.node is not None:
            self.tree.unlock(seq.node)
        self.pool.release_pages(seq.pages)
        del self._seqs[key]

    def path_stats(self, token_ids: Sequence[int]) -> dict[str, int]:
        """How much of ``token_ids`` the cache holds now, without touching it.

        Returns:
            ``cached_tokens`` (longest prefix in the radix tree, tokens) and ``checkpoints``
            (recurrent-state checkpoints held on that path).

        Raises:
            TypeError, ValueError: bad token ids.
        """
        depth, path = self.tree.peek(token_ids)
        return {"cached_tokens": depth,
                "checkpoints": sum(1 for node in path if node.checkpoint is not None)}

    def checkpoint_depths(self, token_ids: Sequence[int]) -> tuple[int, ...]:
        """Depths (tokens consumed) of the checkpoints held on the cached path of ``token_ids``,
        shallowest first, without touching the cache.

        Raises:
            TypeError, ValueError: bad token ids.
        """
        _, path = self.tree.peek(token_ids)
        return tuple(sorted(node.depth for node in path if node.checkpoint is not None))

    @property
    def num_requests(self) -> int:
        """Requests currently holding pages or locks."""
        return len(self._seqs)

    def stats(self) -> dict[str, int]:
        """Gauges and counters: pages (total, free, held only by unlocked radix nodes), tree
        tokens/nodes, requests holding pages, checkpoints (see ``CheckpointStore.stats``).
        Walks the tree: O(nodes)."""
        out = {
            "kv_pages_total": self.pool.num_pages,
            "kv_pages_free": self.pool.num_free_pages,
            "kv_pages_evictable": self.tree.evictable_pages_hint(),
            "radix_tokens": self.tree.num_tokens,
            "radix_nodes": self.tree.num_nodes,
            "requests": len(self._seqs),
        }
        if self.store is not None:
            out.update({f"checkpoint_{k}": int(v) for k, v in self.store.stats().items()})
        return out


def default_num_pages(kv_layout: KVLayout, page_size: int, max_model_len: int,
                      max_running: int, budget_bytes: int | None, explicit: bool = False) -> int:
    """KV pages for the pool: room for ``max_running`` full-length sequences, capped by
    ``budget_bytes``; a default budget never goes below one full-length sequence plus one page,
    an ``explicit`` one is taken as given (at least two pages; longer requests are then refused).

    Args:
        kv_layout: attention KV shape.
        page_size: tokens per page.
        max_model_len: longest sequence (tokens).
        max_running: concurrent requests.
        budget_bytes: byte cap (None: no cap).
        explicit: ``budget_bytes`` came from the user (``--kv-cache-bytes``).
    """
    per_page = kv_layout.bytes_per_token() * page_size
    if explicit and budget_bytes is not None and per_page > 0:
        return max(2, budget_bytes // per_page)
    want = pages_for_tokens(max_model_len, page_size) * max_running
    floor = pages_for_tokens(max_model_len, page_size) + 1
    if budget_bytes is not None and per_page > 0:
        want = min(want, max(1, math.floor(budget_bytes / per_page)))
    return max(want, floor)


StateTensors = Callable[[int], Sequence[torch.Tensor] | None]
"""``request key -> live recurrent-state tensors`` (the model runner's), or None."""
