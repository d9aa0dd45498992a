"""Paged KV cache of one sequence: K/V rows live in a shared :class:`KVPagePool`.

A sequence's attention layers share one :class:`SlotTable` (its token slots, in position order;
token slot ``s`` is row ``s`` of ``pool.k[layer]``). :class:`PagedKV` is the drop-in for
``state.KVCache`` that :class:`~freetoken.models.attention.Attention` appends to: new K/V rows
are scattered into the pool at the table's slots, and the first ``n`` positions are gathered
back as ``[nkv, n, head_dim]`` for ``scaled_dot_product_attention``. Slots need not be
contiguous, so sequences can share the pages of a common prefix (FreeToken paper §3.1; the
block-table idea of vLLM's PagedAttention, SOSP 2023, written here for a gather-based CPU/GPU
path).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


def _as_slots(slots, device) -> torch.Tensor:
    """``slots`` (list / numpy / tensor of ints) as a 1-D int64 tensor on ``device``."""
    if isinstance(slots, torch.Tensor):
        t = slots
    else:
        t = torch.as_tensor(np.asarray(slots, dtype=np.int64).reshape(-1))
    if t.dim() != 1 or t.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
        raise ValueError(f"slots must be a 1-D integer sequence, got shape {tuple(t.shape)} "
                         f"dtype {t.dtype}")
    return t.to(device=device, dtype=torch.int64)


class SlotTable:
    """KV token slots of one sequence, in position order, shared by all its attention layers.

    Capacity doubles when full (amortised O(1) copy per appended slot).

    Args:
        slots: initial slots (list / numpy / tensor of int), position 0 first; may be empty.
        device: where :attr:`slots` lives (the pool's device).

    Attributes:
        slots: ``[capacity]`` int64; the first :attr:`length` entries are valid.
        length: number of valid slots (positions the sequence may hold).

    Raises:
        ValueError: ``slots`` is not a 1-D integer sequence or holds a negative slot.
    """

    def __init__(self, slots: Sequence[int] | np.ndarray | torch.Tensor = (),
                 device=None) -> None:
        self.length = 0
        self._set_backing(torch.empty(16, dtype=torch.int64, device=device))
        self.extend(slots)

    def _set_backing(self, slots: torch.Tensor) -> None:
        self.slots = slots
        # a CPU table takes Python ints through numpy: a decode step appends one slot, and a
        # torch op right after a step that streamed the weights costs tens of microseconds
        self._host = slots.numpy() if slots.device.type == "cpu" else None

    @property
    def capacity(self) -> int:
        """Slots the backing tensor holds before it must grow."""
        return self.slots.shape[0]

    def extend(self, slots) -> None:
        """Append ``slots`` (positions ``length .. length + len(slots) - 1``).

        Raises:
            ValueError: not a 1-D integer sequence, or a negative slot.
        """
        if self._host is not None and isinstance(slots, (list, tuple)) and all(
                type(s) is int for s in slots):
            if not slots:
                return
            low = min(slots)
            if low < 0:
                raise ValueError(f"token slots must be >= 0, got {low}")
            end = self._reserve(len(slots))
            self._host[self.length : end] = slots
            self.length = end
            return
        new = _as_slots(slots, self.slots.device)
        n = new.shape[0]
        if not n:
            return
        if int(new.min()) < 0:
            raise ValueError(f"token slots must be >= 0, got {int(new.min())}")
        end = self._reserve(n)
        self.slots[self.length : end] = new
        self.length = end

    def _reserve(self, n: int) -> int:
        """Room for ``n`` more slots (capacity doubled when short); returns the new length."""
        end = self.length + n
        if end > self.capacity:
            grown = self.slots.new_empty(max(end, 2 * self.capacity))
            grown[: self.length] = self.slots[: self.length]
            self._set_backing(grown)
        return end

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` slots (the caller releases the dropped ones in the pool).

        Raises:
            ValueError: ``n`` outside ``[0, length]``.
        """
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot truncate a slot table of {self.length} slots to {n}")
        self.length = n

    def valid(self) -> torch.Tensor:
        """``[length]`` int64 view of the valid slots."""
        return self.slots[: self.length]


class PagedKV:
    """KV cache of one attention layer of one sequence, stored in a :class:`KVPagePool`.

    Same contract as ``state.KVCache`` (``length``, ``append``). The model's attention layers
    are numbered ``0..num_layers-1`` in pool order (full-attention layers only).

    Args:
        pool: a ``freetoken.prefix.kv_pool.KVPagePool`` (``k``/``v``:
            ``[num_layers, num_slots, nkv, head_dim]``).
        layer: this layer's index among the model's attention layers.
        table: the sequence's slot table (shared with its other attention layers).
        length: positions already stored (a restored prefix: its K/V are in the pool at
            ``table.slots[:length]``).

    Raises:
        ValueError: ``layer`` outside the pool or ``length`` negative.
    """

    def __init__(self, pool, layer: int, table: SlotTable, length: int = 0) -> None:
        if not 0 <= layer < pool.k.shape[0]:
            raise ValueError(f"attention layer {layer} outside the pool's {pool.k.shape[0]} layers")
        if length < 0:
            raise ValueError(f"length must be >= 0, got {length}")
        self.pool, self.layer, self.table, self.length = pool, layer, table, length

    def check_room(self, t: int) -> None:
        """Raise unless the table has slots for ``t`` more positions.

        Raises:
            RuntimeError: ``table.length < length + t`` (the message gives both numbers).
        """
        end = self.length + t
        if self.table.length < end:
            raise RuntimeError(
                f"slot table has {self.table.length} token slots but attention layer "
                f"{self.layer} needs {end} ({self.length} cached + {t} new); extend the "
                f"SlotTable before the forward"
            )

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``T`` new positions in the pool and return K, V of all ``n`` positions.

        Args:
            k, v: ``[T, nkv, head_dim]`` (already rotated K), cast to the pool dtype.

        Returns:
            ``(K, V)``, each ``[nkv, n, head_dim]`` (``n = length + T``), gathered from the pool
            (a copy: later writes to the pool do not change it).

        Raises:
            RuntimeError: the table has fewer than ``length + T`` slots (nothing written).
        """
        t = k.shape[0]
        self.check_room(t)
        end = self.length + t
        pk, pv = self.pool.k[self.layer], self.pool.v[self.layer]
        new = self.table.slots[self.length : end]
        pk.index_copy_(0, new, k.to(pk.dtype))
        pv.index_copy_(0, new, v.to(pv.dtype))
        self.length = end
        used = self.table.slots[:end]
        return pk.index_select(0, used).transpose(0, 1), pv.index_select(0, used).transpose(0, 1)


@dataclass(frozen=True)
class PagedDecodeBatch:
    """The attention metadata of one decode step (one new token per sequence), built once per
    step and shared by every attention layer (a sequence's layers share its slot table).

    Attributes:
        kv_slots: ``[N]`` int64, each sequence's slots of positions ``0..n_b-1`` in order
            (the new token's slot last), concatenated.
        kv_offsets: ``[B + 1]`` int64, sequence ``b`` owns ``kv_slots[kv_offsets[b]:kv_offsets[b+1]]``.
        cos, sin: ``[B, rot/2]`` fp32 RoPE tables at each sequence's new position.
    """

    kv_slots: torch.Tensor
    kv_offsets: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor

    @classmethod
    def of_layer(cls, caches: list, positions: list[int], rotary) -> "PagedDecodeBatch | None":
        """:meth:`build` from one attention layer's cache of each sequence, or None unless every
        one is a :class:`PagedKV` of the same pool (whose ``k`` / ``v`` the step then uses)."""
        if not all(isinstance(kv, PagedKV) and kv.pool is caches[0].pool for kv in caches):
            return None
        return cls.build([kv.table for kv in caches], positions, rotary)

    @classmethod
    def build(cls, tables: list[SlotTable], positions: list[int], rotary) -> "PagedDecodeBatch":
        """Metadata for sequences whose new tokens sit at ``positions`` (their tables hold at
        least ``position + 1`` slots); ``rotary``: the model's ``RotaryTable``."""
        lengths = [p + 1 for p in positions]
        if len(tables) == 1:
            kv_slots = tables[0].slots[: lengths[0]]
        else:
            kv_slots = torch.cat([t.slots[:n] for t, n in zip(tables, lengths)])
        offsets = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int64)
        cos, sin = rotary.at(positions)
        return cls(kv_slots, offsets, cos, sin)
