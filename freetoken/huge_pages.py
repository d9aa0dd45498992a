"""Transparent huge pages for the large CPU tensors a decode step streams (weights, expert
banks, the KV page pool).

Decode reads every weight byte once per step, so it runs at the memory bandwidth, and with 4 KiB
pages that stream takes a TLB miss every 4 KiB: on the 2-core dev machine the rows_dot kernel
reads a 32 MiB bf16 matrix at 28-33 GB/s on 4 KiB pages and 35-39 GB/s on 2 MiB ones. Linux
backs an anonymous range with 2 MiB pages on first touch once it is advised ``MADV_HUGEPAGE``
(transparent_hugepage ``madvise`` or ``always``); this module advises tensors that torch has
allocated but not yet written. Elsewhere (other OS, THP ``never``) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Iterable

import torch

HUGE_PAGE = 2 << 20  # bytes of an x86-64 / arm64 transparent huge page
MADV_HUGEPAGE = 14  # <asm-generic/mman-common.h>

_libc = None


def _madvise():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return _libc.madvise


def huge_span(tensor: torch.Tensor) -> tuple[int, int]:
    """``(address, bytes)`` of the whole 2 MiB pages inside ``tensor``'s storage (0 bytes when
    it spans none)."""
    start = tensor.untyped_storage().data_ptr()
    end = start + tensor.untyped_storage().nbytes()
    first = (start + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE
    last = end // HUGE_PAGE * HUGE_PAGE
    return first, max(0, last - first)


def advise_huge_pages(tensors: Iterable[torch.Tensor]) -> int:
    """Advise ``MADV_HUGEPAGE`` over the whole 2 MiB pages of each CPU tensor's storage (pinned
    and non-CPU tensors are skipped; a storage shared by several tensors is advised once). Call
    it before the tensors are first written: pages already touched stay small until the
    kernel's khugepaged collapses them.

    Returns:
        bytes advised (0 on a system without ``madvise`` huge pages, or when every ``madvise``
        call was refused).
    """
    if not sys.platform.startswith("linux"):
        return 0
    advised, seen = 0, set()
    for t in tensors:
        if t.device.type != "cpu" or t.is_pinned():
            continue
        address, size = huge_span(t)
        if size == 0 or address in seen:
            continue
        seen.add(address)
        if _madvise()(address, size, MADV_HUGEPAGE) == 0:
            advised += size
    return advised
