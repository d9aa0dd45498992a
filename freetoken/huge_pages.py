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
import errno
import os
import queue
import sys
import threading
from collections.abc import Callable, Iterable

import torch

HUGE_PAGE = 2 << 20  # bytes of an x86-64 / arm64 transparent huge page
MADV_HUGEPAGE = 14  # <asm-generic/mman-common.h>
MADV_NOHUGEPAGE = 15
MADV_COLLAPSE = 25  # Linux >= 6.1
COLLAPSE_PIECE = 32 * HUGE_PAGE  # bytes per MADV_COLLAPSE call: threads share a pool evenly

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


def huge_spans(tensors: Iterable[torch.Tensor]) -> list[tuple[int, int]]:
    """:func:`huge_span` of each CPU tensor's storage that spans a whole 2 MiB page, once per
    storage (pinned and non-CPU tensors are skipped)."""
    spans, seen = [], set()
    for t in tensors:
        if t.device.type != "cpu" or t.is_pinned():
            continue
        address, size = huge_span(t)
        if size and address not in seen:
            seen.add(address)
            spans.append((address, size))
    return spans


def advise_huge_pages(tensors: Iterable[torch.Tensor], advice: int = MADV_HUGEPAGE) -> int:
    """Advise ``MADV_HUGEPAGE`` (or ``advice``) over the whole 2 MiB pages of each CPU tensor's
    storage (pinned and non-CPU tensors are skipped; a storage shared by several tensors is
    advised once). Call it before the tensors are first written: pages already touched stay
    small until the kernel's khugepaged collapses them (or :func:`collapse_huge_pages`).

    Returns:
        bytes advised (0 on a system without ``madvise`` huge pages, or when every ``madvise``
        call was refused).
    """
    if not sys.platform.startswith("linux"):
        return 0
    return sum(size for address, size in huge_spans(tensors)
               if _madvise()(address, size, advice) == 0)


def collapse_huge_pages(tensors: Iterable[torch.Tensor], threads: int | None = None,
                        progress: Callable[[int], None] | None = None,
                        piece: int = COLLAPSE_PIECE,
                        stop: threading.Event | None = None) -> int:
    """Back the whole 2 MiB pages of each CPU tensor's storage, already written on small pages,
    with 2 MiB pages now: advise ``MADV_HUGEPAGE``, then ``MADV_COLLAPSE`` (Linux >= 6.1) in
    ``piece``-byte pieces from ``threads`` daemon threads (default: one per CPU). ``progress``
    (called on this thread) gets each piece's byte count as it completes, collapsed or not;
    once ``stop`` is set, pieces not yet started stay on small pages.

    Returns:
        bytes collapsed: 0 where ``MADV_COLLAPSE`` is unknown (older kernels) or THP is off;
        the advice stays, so khugepaged may still collapse them over time.
    """
    if not sys.platform.startswith("linux"):
        return 0
    pieces = []
    for address, size in huge_spans(tensors):
        _madvise()(address, size, MADV_HUGEPAGE)
        pieces += [(a, min(piece, address + size - a))
                   for a in range(address, address + size, piece)]
    if not pieces:
        return 0
    try:
        collapsed = _collapse(pieces[0])
    except _Unsupported:
        return 0
    if progress is not None:
        progress(pieces[0][1])
    rest, lock, done = iter(pieces[1:]), threading.Lock(), queue.SimpleQueue()

    def work() -> None:
        while stop is None or not stop.is_set():
            with lock:
                span = next(rest, None)
            if span is None:
                break
            try:
                done.put((span[1], _collapse(span)))
            except _Unsupported:
                done.put((span[1], 0))
        done.put(None)

    # daemon threads (not an executor): an exiting process does not wait for them
    workers = [threading.Thread(target=work, name="freetoken-collapse", daemon=True)
               for _ in range(max(1, threads or os.cpu_count() or 1))]
    for worker in workers:
        worker.start()
    running = len(workers)
    while running:
        item = done.get()
        if item is None:
            running -= 1
            continue
        collapsed += item[1]
        if progress is not None:
            progress(item[0])
    return collapsed


def _collapse(span: tuple[int, int]) -> int:
    """``MADV_COLLAPSE`` of ``span`` (address, bytes): its bytes when collapsed, 0 when the
    kernel could not now (EAGAIN, ENOMEM: it stays on small pages).

    Raises:
        _Unsupported: EINVAL (no ``MADV_COLLAPSE`` here, or THP ``never``).
    """
    if _madvise()(span[0], span[1], MADV_COLLAPSE) == 0:
        return span[1]
    if ctypes.get_errno() == errno.EINVAL:
        raise _Unsupported
    return 0


class _Unsupported(Exception):
    """``MADV_COLLAPSE`` answered EINVAL."""


def anon_huge_bytes() -> int:
    """This process's anonymous memory on 2 MiB pages (``AnonHugePages`` of
    ``/proc/self/smaps_rollup``; 0 where that file does not exist)."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            line = next((line for line in f if line.startswith("AnonHugePages:")), None)
    except OSError:
        return 0
    return 0 if line is None else int(line.split()[1]) * 1024
