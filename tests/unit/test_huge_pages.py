"""``freetoken.huge_pages``: the span it advises, and that Linux then backs the tensor with
2 MiB pages (read back from /proc/self/smaps) wherever transparent huge pages are not off, on
first touch or, for pages written small, by collapsing them."""

from __future__ import annotations

import re
import sys

import torch

from freetoken.heap import MMAP_THRESHOLD
from freetoken.huge_pages import (
    COLLAPSE_PIECE,
    HUGE_PAGE,
    MADV_NOHUGEPAGE,
    advise_huge_pages,
    anon_huge_bytes,
    collapse_huge_pages,
    huge_span,
)
from tests.unit.smaps import THP, anon_huge_in, collapse_supported


def test_span_is_the_whole_huge_pages_inside_the_storage() -> None:
    t = torch.empty(5 * HUGE_PAGE + 123, dtype=torch.uint8)
    address, size = huge_span(t)
    start = t.untyped_storage().data_ptr()
    assert address % HUGE_PAGE == 0 and start <= address < start + HUGE_PAGE
    assert address + size <= start + t.numel() and size % HUGE_PAGE == 0 and size >= 4 * HUGE_PAGE
    assert huge_span(torch.empty(HUGE_PAGE // 2, dtype=torch.uint8))[1] == 0


def test_advised_tensor_is_backed_by_huge_pages() -> None:
    # 96 MiB: above the mmap threshold keep_freed_heap sets (64 MiB), so the storage is a fresh
    # mapping even after an earlier test in this process raised it (heap memory may already be
    # backed by small pages, which advice after the fact does not change)
    assert MMAP_THRESHOLD < 48 * HUGE_PAGE
    weights = torch.empty(48 * HUGE_PAGE // 2, dtype=torch.bfloat16)
    address, size = huge_span(weights)
    advised = advise_huge_pages([weights, weights.view(-1, 2), torch.empty(10)])
    if not sys.platform.startswith("linux"):
        assert advised == 0
        return
    assert advised == size  # the second view shares the storage; the small tensor spans none
    weights.fill_(1.0)  # first touch
    mode = re.search(r"\[(\w+)\]", THP.read_text())[1] if THP.exists() else "never"
    huge = anon_huge_in(address, size)
    if mode == "never":
        assert huge == 0
    else:  # the kernel may fall back to small pages when memory is fragmented: most, not all
        assert huge >= size // 2


def test_small_pages_written_then_collapsed_keep_their_bytes() -> None:
    # 96 MiB: a fresh mapping (see above); advised small pages, so the writes take 4 KiB pages
    data = torch.empty(48 * HUGE_PAGE, dtype=torch.uint8)
    address, size = huge_span(data)
    advised = advise_huge_pages([data], MADV_NOHUGEPAGE)
    assert advised == (size if sys.platform.startswith("linux") and THP.exists() else 0)
    data.copy_(torch.arange(data.numel(), dtype=torch.int64).remainder(251).to(torch.uint8))
    # no check that the writes took small pages: after other tests the allocator may hand out
    # memory that is already huge (glibc raises its mmap threshold as large blocks are freed)
    pieces: list[int] = []
    collapsed = collapse_huge_pages([data, data[:10]], progress=pieces.append)
    assert sum(pieces) == size and max(pieces) == COLLAPSE_PIECE  # every piece, once
    assert torch.equal(data, torch.arange(data.numel()).remainder(251).to(torch.uint8))
    if not collapse_supported():
        assert collapsed == 0
        return
    # a piece the kernel cannot collapse now (no free 2 MiB page) stays small: most, not all
    assert collapsed >= size // 2 and anon_huge_in(address, size) >= collapsed
    assert anon_huge_bytes() >= collapsed
