"""Paged K/V storage shared by all requests and the radix tree (paper §3.1, prefix reuse).

The pool holds the keys and values of every full-attention layer in fixed-size pages. Token slot
``s`` is row ``s`` of ``k[layer]`` / ``v[layer]`` and lives on page ``s // page_size`` at offset
``s % page_size``. A page is reference counted: the request that allocated it holds one writer ref
(dropped by :meth:`KVPagePool.release_pages`) and every holder of a token slot (the radix tree
stores one ref per token it keeps) holds one ref per slot on the page (:meth:`KVPagePool.incref`,
:meth:`KVPagePool.decref`). A page goes back to the free list when its count reaches zero.

The paging idea follows vLLM's PagedAttention block manager and SGLang's token-to-KV pool; the
code is our own.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np
import torch

from freetoken.huge_pages import advise_huge_pages


@dataclass(frozen=True)
class KVLayout:
    """Per-token K/V geometry of a model's full-attention layers.

    Attributes:
        num_layers: full-attention layers only (Gated DeltaNet layers keep no KV). 0 gives a pool
            of token slots without K/V storage (a model with no attention layer).
        num_kv_heads: KV heads per layer (GQA groups).
        head_dim: channels per head.
        dtype: storage dtype of K and V (the model's compute dtype).

    Raises:
        ValueError: a negative layer count, a non-positive head count or head size, or a dtype
            that is not a ``torch.dtype``.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    def __post_init__(self) -> None:
        for name, low in (("num_layers", 0), ("num_kv_heads", 1), ("head_dim", 1)):
            object.__setattr__(self, name, _int_at_least(getattr(self, name), low, name))
        if not isinstance(self.dtype, torch.dtype):
            raise ValueError(f"dtype must be a torch.dtype, got {self.dtype!r}")

    def bytes_per_token(self) -> int:
        """Bytes of K plus V of one token over all layers:
        ``2 * num_layers * num_kv_heads * head_dim * itemsize``."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype.itemsize


def _int_at_least(value, low: int, name: str) -> int:
    """``value`` as a Python int (numpy ints accepted); ValueError unless an int >= ``low``."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}") from None
    if number < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return number


def num_pages_for(num_bytes: int, layout: KVLayout, page_size: int) -> int:
    """Whole pages of ``page_size`` tokens that fit in a budget of ``num_bytes`` bytes.

    Raises:
        ValueError: ``num_bytes < 0``, ``page_size < 1``, or a layout with no K/V bytes (no
            attention layer: a byte budget cannot size such a pool).
    """
    if num_bytes < 0:
        raise ValueError(f"num_bytes must be >= 0, got {num_bytes}")
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    per_page = layout.bytes_per_token() * page_size
    if per_page == 0:
        raise ValueError("the layout has no K/V bytes (num_layers == 0); give num_pages directly")
    return int(num_bytes) // per_page


class OutOfPages(RuntimeError):
    """Raised by :meth:`KVPagePool.alloc_pages` when fewer pages are free than asked for.

    Attributes:
        requested: pages asked for.
        free: pages free at the time.
    """

    def __init__(self, requested: int, free: int) -> None:
        super().__init__(f"KV page pool exhausted: asked for {requested} pages, {free} free")
        self.requested = requested
        self.free = free


def as_slot_array(slots) -> np.ndarray:
    """Token slots as a flat int64 numpy array.

    Args:
        slots: a list/tuple/range of ints, a numpy integer array, or a torch integer tensor (any
            device, any shape; flattened).

    Raises:
        TypeError: a non-integer array or tensor.
    """
    if isinstance(slots, torch.Tensor):
        if slots.is_floating_point() or slots.is_complex() or slots.dtype == torch.bool:
            raise TypeError(f"token slots must be integers, got a {slots.dtype} tensor")
        return slots.detach().to("cpu", torch.int64).numpy().reshape(-1)
    if isinstance(slots, range):
        return np.arange(slots.start, slots.stop, slots.step, dtype=np.int64)
    arr = np.asarray(slots)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"token slots must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False).reshape(-1)


class KVPagePool:
    """Paged K/V storage of every full-attention layer; token slot s = page * page_size + offset.

    Args:
        layout: per-token K/V geometry (:class:`KVLayout`).
        num_pages: pages in the pool (>= 1).
        page_size: token slots per page (>= 1).
        device: torch device of ``k`` and ``v`` (default: torch's default device).

    Attributes:
        layout, page_size, num_pages, num_slots (``num_pages * page_size``).
        k: ``[num_layers, num_slots, num_kv_heads, head_dim]`` keys, ``layout.dtype``, on
            ``device``, uninitialised (only written slots are ever read).
        v: values, same shape/dtype/device.

    Raises:
        ValueError: ``num_pages < 1`` or ``page_size < 1``.
    """

    def __init__(self, layout: KVLayout, num_pages: int, page_size: int, device=None) -> None:
        num_pages = _int_at_least(num_pages, 1, "num_pages")
        page_size = _int_at_least(page_size, 1, "page_size")
        self.layout = layout
        self.num_pages = num_pages
        self.page_size = page_size
        self.num_slots = num_pages * page_size
        shape = (layout.num_layers, self.num_slots, layout.num_kv_heads, layout.head_dim)
        self.k = torch.empty(shape, dtype=layout.dtype, device=device)
        self.v = torch.empty(shape, dtype=layout.dtype, device=device)
        advise_huge_pages((self.k, self.v))  # decode attention streams the K/V rows
        self._ref = np.zeros(num_pages, dtype=np.int64)
        # Stack of free pages; popping from the end hands out 0, 1, 2, ... first.
        self._free: list[int] = list(range(num_pages - 1, -1, -1))

    # --- allocation ------------------------------------------------------------------------
    @property
    def num_free_pages(self) -> int:
        """Pages with refcount 0."""
        return len(self._free)

    @property
    def num_used_pages(self) -> int:
        """Pages with refcount > 0."""
        return self.num_pages - len(self._free)

    def alloc_pages(self, n: int) -> list[int]:
        """Take ``n`` free pages, all or nothing; each gets refcount 1 (the writer's ref).

        Raises:
            ValueError: ``n < 0``.
            OutOfPages: fewer than ``n`` pages are free (nothing is taken).
        """
        if n < 0:
            raise ValueError(f"cannot allocate {n} pages")
        if n > len(self._free):
            raise OutOfPages(n, len(self._free))
        pages = [self._free.pop() for _ in range(n)]
        self._ref[pages] = 1
        return pages

    def page_slots(self, page: int) -> range:
        """The ``page_size`` token slots of ``page``.

        Raises:
            ValueError: ``page`` outside ``[0, num_pages)``.
        """
        if not 0 <= page < self.num_pages:
            raise ValueError(f"page {page} outside the pool's {self.num_pages} pages")
        return range(page * self.page_size, (page + 1) * self.page_size)

    def slots_of_pages(self, pages) -> np.ndarray:
        """int64 ``[len(pages) * page_size]`` token slots of ``pages``, page by page in order.

        Raises:
            ValueError: a page outside ``[0, num_pages)``.
        """
        pages = self._check_pages(as_slot_array(pages))
        offsets = np.arange(self.page_size, dtype=np.int64)
        return (pages[:, None] * self.page_size + offsets[None, :]).reshape(-1)

    def pages_for_tokens(self, num_tokens: int) -> int:
        """Pages needed to hold ``num_tokens`` token slots (ceil division)."""
        return -(-int(num_tokens) // self.page_size)

    # --- reference counting ----------------------------------------------------------------
    def incref(self, slots) -> None:
        """+1 on the page of each token slot (a page named k times gets +k).

        Args:
            slots: token slots (list/range/numpy/torch integers, any shape).

        Raises:
            ValueError: a slot outside ``[0, num_slots)``.
            RuntimeError: a slot on a free page (a ref to storage nobody allocated); nothing
                is changed.
        """
        pages = self._pages_of(slots)
        if pages.size == 0:
            return
        free = pages[self._ref[pages] == 0]
        if free.size:
            raise RuntimeError(f"incref of token slots on free KV pages {np.unique(free).tolist()}")
        np.add.at(self._ref, pages, 1)

    def decref(self, slots) -> None:
        """-1 on the page of each token slot; pages reaching 0 go back to the free list.

        Raises:
            ValueError: a slot outside ``[0, num_slots)``.
            RuntimeError: a page would go below 0 (double free); nothing is changed.
        """
        self._drop(self._pages_of(slots))

    def release_pages(self, pages) -> None:
        """Drop the writer ref of each page (``pages`` as from :meth:`alloc_pages`).

        Raises:
            ValueError: a page outside ``[0, num_pages)``.
            RuntimeError: a page would go below 0 (double free); nothing is changed.
        """
        self._drop(self._check_pages(as_slot_array(pages)))

    def refcounts(self) -> np.ndarray:
        """int64 ``[num_pages]`` copy of the page refcounts (tests, leak checks)."""
        return self._ref.copy()

    def check_invariants(self) -> None:
        """Raise AssertionError unless the free list is exactly the pages with refcount 0, without
        duplicates, and no refcount is negative."""
        free = np.asarray(self._free, dtype=np.int64)
        assert np.unique(free).size == free.size, "a page sits twice in the free list"
        assert np.array_equal(np.sort(free), np.flatnonzero(self._ref == 0)), \
            "free list differs from the pages with refcount 0"
        assert int(self._ref.min()) >= 0, "negative page refcount"

    # --- internals -------------------------------------------------------------------------
    def _pages_of(self, slots) -> np.ndarray:
        arr = as_slot_array(slots)
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= self.num_slots):
            bad = arr[(arr < 0) | (arr >= self.num_slots)]
            raise ValueError(f"token slot {int(bad[0])} outside the pool's {self.num_slots} slots")
        return arr // self.page_size

    def _check_pages(self, pages: np.ndarray) -> np.ndarray:
        if pages.size and (int(pages.min()) < 0 or int(pages.max()) >= self.num_pages):
            bad = pages[(pages < 0) | (pages >= self.num_pages)]
            raise ValueError(f"page {int(bad[0])} outside the pool's {self.num_pages} pages")
        return pages

    def _drop(self, pages: np.ndarray) -> None:
        """-1 per entry of ``pages`` (repeats count); validated before anything changes."""
        if pages.size == 0:
            return
        uniq, counts = np.unique(pages, return_counts=True)
        over = uniq[self._ref[uniq] < counts]
        if over.size:
            raise RuntimeError(
                f"double free of KV pages {over.tolist()} (refcount would go below 0)")
        self._ref[uniq] -= counts
        self._free.extend(uniq[self._ref[uniq] == 0].tolist())
