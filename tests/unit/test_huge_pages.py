"""``freetoken.huge_pages``: the span it advises, and that Linux then backs the tensor with
2 MiB pages (read back from /proc/self/smaps) wherever transparent huge pages are not off."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import torch

from freetoken.heap import MMAP_THRESHOLD
from freetoken.huge_pages import HUGE_PAGE, advise_huge_pages, huge_span

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _anon_huge_bytes(address: int, size: int) -> int:
    """AnonHugePages of the mappings of /proc/self/smaps inside [address, address + size)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if head:
            lo, hi = int(head[1], 16), int(head[2], 16)
            inside = lo < address + size and hi > address
        elif inside and line.startswith("AnonHugePages:"):
            total += int(line.split()[1]) * 1024
    return total


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
    huge = _anon_huge_bytes(address, size)
    if mode == "never":
        assert huge == 0
    else:  # the kernel may fall back to small pages when memory is fragmented: most, not all
        assert huge >= size // 2
