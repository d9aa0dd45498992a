"""Recurrent-state checkpoints of a hybrid model, in a device tier and a host tier.

A Gated DeltaNet layer's state (conv state + delta-rule memory, model-architectures.md §1.6) sums up
the whole prefix, so unlike the KV cache it cannot be cut at an arbitrary token: a prefix hit can
resume only where a copy of the state was saved. The store keeps such copies, one per radix node
(the state after the node's ``depth`` tokens), in ``device_slots`` preallocated slots on the
model's device and, behind them, a host-memory tier bounded by ``host_bytes``. A full device tier
spills its lowest-value checkpoint to the host tier; a full store drops the lowest-value one
(:mod:`freetoken.prefix.retention`). Paper §3.1; the two tiers follow checkpoint-policy-sim.md
finding 2 (capacity plus value-aware eviction).

Copies are blocking ``copy_`` calls (no ``non_blocking``), so a slot or host buffer is never
reused while a transfer from it may still be in flight.

Radix nodes are used only through ``parent``, ``children``, ``depth``, ``lock_ref`` and
``checkpoint`` (:mod:`freetoken.prefix.radix`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from freetoken.prefix.retention import pick_victim

DEVICE = "device"
HOST = "host"


@dataclass(frozen=True)
class RecurrentLayout:
    """Shapes and dtypes of one sequence's recurrent-state tensors.

    Attributes:
        shapes: one ``(shape, dtype)`` per state tensor, in the order of
            ``model.recurrent_tensors(state)`` (``[conv_0, rec_0, conv_1, rec_1, ...]``: conv state
            ``[conv_dim, K-1]`` in the model dtype, recurrent state ``[Hv, dk, dv]`` fp32).
            Empty for a model without recurrent layers.

    Raises:
        TypeError: an entry is not ``(tuple of int >= 0, torch.dtype)``.
    """

    shapes: tuple[tuple[tuple[int, ...], torch.dtype], ...]

    def __post_init__(self) -> None:
        for entry in self.shapes:
            ok = isinstance(entry, tuple) and len(entry) == 2
            if ok:
                shape, dtype = entry
                ok = (isinstance(shape, tuple) and isinstance(dtype, torch.dtype)
                      and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape))
            if not ok:
                raise TypeError(
                    f"RecurrentLayout entry must be (tuple of int >= 0, torch.dtype), got {entry!r}")

    @classmethod
    def of(cls, tensors: Sequence[torch.Tensor]) -> "RecurrentLayout":
        """The layout of live state tensors (their shapes and dtypes)."""
        return cls(tuple((tuple(t.shape), t.dtype) for t in tensors))

    def bytes_per_checkpoint(self) -> int:
        """Bytes of one checkpoint: sum over tensors of ``numel * itemsize``."""
        return sum(math.prod(shape) * dtype.itemsize for shape, dtype in self.shapes)

    def check(self, tensors: Sequence[torch.Tensor], what: str) -> None:
        """Raise ValueError unless ``tensors`` match this layout one to one (count, shape, dtype)."""
        if len(tensors) != len(self.shapes):
            raise ValueError(f"{what}: expected {len(self.shapes)} recurrent tensors, got {len(tensors)}")
        for i, (t, (shape, dtype)) in enumerate(zip(tensors, self.shapes)):
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or t.dtype != dtype:
                got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{what}: tensor {i} must be {shape} {dtype}, got {got}")


@dataclass
class _Entry:
    node: Any
    tier: str
    slot: int | None                    # device slot index (device tier)
    host: list[torch.Tensor] | None     # host copies (host tier)
    last_use: float


def _can_pin(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    try:
        return bool(torch.empty(1, pin_memory=True).is_pinned())
    except RuntimeError:
        return False


class CheckpointStore:
    """Two tiers: ``device_slots`` preallocated slots on ``device``; a host tier (pinned when device is
    CUDA and pinning works) bounded by ``host_bytes``. A checkpoint lives in exactly one tier.

    Args:
        layout: the state tensors of one checkpoint.
        device_slots: checkpoints the device tier holds (>= 0), allocated up front as one
            ``[device_slots, *shape]`` tensor per layout entry.
        host_bytes: byte budget of the host tier (>= 0); it holds
            ``host_bytes // layout.bytes_per_checkpoint()`` checkpoints (0 for an empty layout).
            Host buffers are allocated on demand and recycled, never more than that many.
        device: torch device of the device tier (default CPU).
        keep_deepest: checkpoints per root-to-leaf path that count as valuable (retention class 1).
        clock: time source for ``last_use`` (seconds).

    Raises:
        ValueError: negative ``device_slots``, ``host_bytes`` or ``keep_deepest``.
    """

    def __init__(self, layout: RecurrentLayout, device_slots: int, host_bytes: int, device=None,
                 keep_deepest: int = 4, clock: Callable[[], float] = time.monotonic) -> None:
        for name, value in (("device_slots", device_slots), ("host_bytes", host_bytes),
                            ("keep_deepest", keep_deepest)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"CheckpointStore {name} must be an int >= 0, got {value!r}")
        self.layout = layout
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.device_slots = device_slots
        self.host_bytes = host_bytes
        self.keep_deepest = keep_deepest
        self.clock = clock
        bpc = layout.bytes_per_checkpoint()
        self.host_capacity = host_bytes // bpc if bpc else 0
        self.pinned = _can_pin(self.device) if self.host_capacity else False
        self.device_tensors = [torch.zeros((device_slots, *shape), dtype=dtype, device=self.device)
                               for shape, dtype in layout.shapes]
        self._free_slots = list(range(device_slots - 1, -1, -1))  # pop() hands out slot 0 first
        self._spare_host: list[list[torch.Tensor]] = []
        self._entries: dict[int, _Entry] = {}
        self._next_id = 0
        self._counters = {"saves": 0, "loads": 0, "spills": 0, "drops": 0, "evictions": 0}

    # ------------------------------------------------------------------ sizes

    @property
    def capacity(self) -> int:
        """Total checkpoints that fit (device slots + host capacity)."""
        return self.device_slots + self.host_capacity

    @property
    def num_checkpoints(self) -> int:
        """Live checkpoints in both tiers."""
        return len(self._entries)

    def num_in(self, tier: str) -> int:
        """Live checkpoints in ``tier`` (``"device"`` or ``"host"``)."""
        return sum(1 for e in self._entries.values() if e.tier == tier)

    def ids(self) -> list[int]:
        """Ids of the live checkpoints, in save order."""
        return list(self._entries)

    def __contains__(self, cid: object) -> bool:
        return cid in self._entries

    def tier_of(self, cid: int) -> str:
        """``"device"`` or ``"host"``. Raises KeyError for an unknown id."""
        return self._entry(cid).tier

    def last_use(self, cid: int) -> float:
        """Clock time of the checkpoint's save or latest load/touch. Raises KeyError."""
        return self._entry(cid).last_use

    def stats(self) -> dict[str, int]:
        """Counts: ``device_count``, ``host_count``, ``device_bytes_used``/``host_bytes_used``
        (bytes of live checkpoints), ``capacity``, and the counters ``saves``, ``loads``, ``spills``
        (device->host moves), ``drops`` (checkpoints removed for any reason: drop, node eviction,
        replacement, store full) and ``evictions`` (the drops caused by a full store)."""
        bpc = self.layout.bytes_per_checkpoint()
        device_count, host_count = self.num_in(DEVICE), self.num_in(HOST)
        return {
            "device_count": device_count,
            "host_count": host_count,
            "device_bytes_used": device_count * bpc,
            "host_bytes_used": host_count * bpc,
            "capacity": self.capacity,
            **self._counters,
        }

    # ------------------------------------------------------------------ public operations

    def save(self, tensors: Sequence[torch.Tensor], node: Any) -> int | None:
        """Copy the live state ``tensors`` into the store as the checkpoint of ``node``.

        The copy goes to a free device slot; with the device tier full, the lowest-value device
        checkpoint first moves to the host tier, and when that one is worth less than every host
        checkpoint (or the host tier has no room for any) it is dropped instead; with the host tier
        full the lowest-value host checkpoint is dropped. Without device slots the copy goes to the
        host tier. The new checkpoint already counts when values are compared (so a deeper save
        makes shallower ones on the same path redundant), but is never the victim.

        Args:
            tensors: live state tensors matching ``layout`` (any device); not aliased.
            node: the radix node whose ``depth`` tokens the state has consumed. An older
                checkpoint at that node is dropped; ``node.checkpoint`` is set to the new id.

        Returns:
            The checkpoint id, or None when the store has capacity 0 (nothing saved, nothing
            changed).

        Raises:
            ValueError: ``tensors`` do not match the layout.
        """
        self.layout.check(tensors, "CheckpointStore.save")
        if self.capacity == 0:
            return None
        if node.checkpoint in self._entries:
            self._remove(node.checkpoint)
        cid = self._next_id
        self._next_id += 1
        node.checkpoint = cid  # counts for retention while room is made
        try:
            self._entries[cid] = self._store_new(tensors, node)
        except BaseException:
            node.checkpoint = None
            raise
        self._counters["saves"] += 1
        return cid

    def load(self, cid: int, into: Sequence[torch.Tensor]) -> None:
        """Copy checkpoint ``cid`` into the live state tensors ``into`` (bit-exact) and refresh its
        last use. It stays in its tier.

        Raises:
            KeyError: unknown ``cid``.
            ValueError: ``into`` does not match the layout.
        """
        entry = self._entry(cid)
        self.layout.check(into, "CheckpointStore.load")
        src = (t[entry.slot] for t in self.device_tensors) if entry.tier == DEVICE else iter(entry.host)
        for dst, s in zip(into, src):
            dst.copy_(s)
        entry.last_use = self.clock()
        self._counters["loads"] += 1

    def touch(self, cid: int) -> None:
        """Refresh the last use of ``cid`` without copying. Raises KeyError."""
        self._entry(cid).last_use = self.clock()

    def drop(self, cid: int) -> None:
        """Free checkpoint ``cid``'s slot/buffers and clear its node's ``checkpoint``.

        Raises:
            KeyError: unknown ``cid``.
        """
        self._entry(cid)
        self._remove(cid)

    def on_node_evicted(self, node: Any) -> None:
        """RadixTree ``on_evict`` hook: drop ``node.checkpoint`` if this store holds it (the
        attribute is cleared either way)."""
        if node.checkpoint in self._entries:
            self._remove(node.checkpoint)
        node.checkpoint = None

    def get_node(self, cid: int) -> Any:
        """The radix node checkpoint ``cid`` belongs to. Raises KeyError for an unknown id."""
        return self._entry(cid).node

    def rebind(self, cid: int, node: Any) -> None:
        """Move checkpoint ``cid`` to another node object (for a radix split that hands the lower
        half to a new object): clears the old node's ``checkpoint``, sets the new one's.

        Raises:
            KeyError: unknown ``cid``.
        """
        entry = self._entry(cid)
        if entry.node.checkpoint == cid:
            entry.node.checkpoint = None
        entry.node = node
        node.checkpoint = cid

    def clear(self) -> None:
        """Drop every checkpoint (counted as drops)."""
        for cid in list(self._entries):
            self._remove(cid)

    def resize_host(self, host_bytes: int) -> int:
        """Set the host tier's byte budget to ``host_bytes`` (>= 0) now: host checkpoints over
        the new capacity are evicted in the store's eviction order (value, then least recently
        used) and spare buffers beyond it are freed. Returns the checkpoints evicted."""
        if host_bytes < 0:
            raise ValueError(f"host_bytes must be >= 0, got {host_bytes}")
        bpc = self.layout.bytes_per_checkpoint()
        self.host_bytes = host_bytes
        self.host_capacity = host_bytes // bpc if bpc else 0
        evicted = 0
        while self.num_in(HOST) > self.host_capacity:
            self._evict(self._pick(HOST))
            evicted += 1
        del self._spare_host[max(0, self.host_capacity - self.num_in(HOST)):]
        return evicted

    def check_invariants(self) -> None:
        """Raise AssertionError unless slots, buffers and node links are consistent."""
        used = sorted(e.slot for e in self._entries.values() if e.tier == DEVICE)
        assert len(set(used)) == len(used), f"device slot used twice: {used}"
        assert sorted(used + self._free_slots) == list(range(self.device_slots)), "device slots leaked"
        assert self.num_in(HOST) <= self.host_capacity, "host tier over capacity"
        assert self.num_in(HOST) + len(self._spare_host) <= self.host_capacity, "host buffers over budget"
        for cid, e in self._entries.items():
            assert e.node.checkpoint == cid, f"checkpoint {cid}: node points at {e.node.checkpoint}"
            assert (e.slot is None) == (e.tier == HOST) and (e.host is None) == (e.tier == DEVICE)

    # ------------------------------------------------------------------ internals

    def _entry(self, cid: int) -> _Entry:
        try:
            return self._entries[cid]
        except (KeyError, TypeError):
            raise KeyError(f"unknown checkpoint id {cid!r}") from None

    def _pick(self, tier: str, extra: int | None = None) -> int:
        candidates = [(cid, e.node, e.last_use) for cid, e in self._entries.items()
                      if e.tier == tier or cid == extra]
        return pick_victim(candidates, self.keep_deepest)

    def _store_new(self, tensors: Sequence[torch.Tensor], node: Any) -> _Entry:
        if self.device_slots:
            if not self._free_slots:
                self._spill_one()
            slot = self._free_slots.pop()
            for dst, src in zip(self.device_tensors, tensors):
                dst[slot].copy_(src)
            return _Entry(node, DEVICE, slot, None, self.clock())
        if self.num_in(HOST) >= self.host_capacity:
            self._evict(self._pick(HOST))
        host = self._host_buffers()
        for dst, src in zip(host, tensors):
            dst.copy_(src)
        return _Entry(node, HOST, None, host, self.clock())

    def _spill_one(self) -> None:
        """Free one device slot: move the lowest-value device checkpoint to the host tier, or drop
        it (or a lower-value host checkpoint to make room)."""
        victim = self._pick(DEVICE)
        if self.host_capacity == 0:
            self._evict(victim)
            return
        if self.num_in(HOST) >= self.host_capacity:
            loser = self._pick(HOST, extra=victim)
            self._evict(loser)
            if loser == victim:
                return
        entry = self._entries[victim]
        host = self._host_buffers()
        for dst, t in zip(host, self.device_tensors):
            dst.copy_(t[entry.slot])
        self._free_slots.append(entry.slot)
        entry.tier, entry.slot, entry.host = HOST, None, host
        self._counters["spills"] += 1

    def _host_buffers(self) -> list[torch.Tensor]:
        if self._spare_host:
            return self._spare_host.pop()
        return [torch.empty(shape, dtype=dtype, pin_memory=self.pinned)
                for shape, dtype in self.layout.shapes]

    def _evict(self, cid: int) -> None:
        self._counters["evictions"] += 1
        self._remove(cid)

    def _remove(self, cid: int) -> None:
        entry = self._entries.pop(cid)
        if entry.tier == DEVICE:
            self._free_slots.append(entry.slot)
        else:
            self._spare_host.append(entry.host)
        if entry.node.checkpoint == cid:
            entry.node.checkpoint = None
        self._counters["drops"] += 1
