"""Host expert banks are filled on small pages and collapsed into 2 MiB pages once final.

The first touch of a fresh 2 MiB page can cost more than reading its bytes from disk: in a VM
whose host backs guest memory page by page on first touch (and takes freed memory back), this
dev machine faults fresh 2 MiB pages in at ~0.4 GB/s per thread but 4 KiB pages at ~2 GB/s, so
a pool advised to huge pages before the load made the packed load wait on its page faults. The
banks are therefore written on small pages, and once they hold their final bytes (after a
quantisation at load) ``MADV_COLLAPSE`` copies them into 2 MiB pages, which the decode kernels
stream faster (``freetoken.huge_pages``): on a CPU device in the background, after the load
(:class:`BackgroundCollapse`), so the server answers at the speed of the reads; before pinning
for a CUDA device (pinned pages cannot move), as the ``huge pages`` load stage
(:func:`collapse_banks`), unless no CPU kernel reads them there (``--moe-backend offload``: the
banks only feed DMA cache fills).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from freetoken.huge_pages import (
    MADV_NOHUGEPAGE,
    advise_huge_pages,
    collapse_huge_pages,
    huge_spans,
)
from freetoken.models.load_progress import LoadProgress, report_stage
from freetoken.offload.banks import ExpertBanks
from freetoken.packed.banks import bank_tensors
from freetoken.units import format_bytes

logger = logging.getLogger("freetoken.offload")


def fill_on_small_pages(banks: Sequence[ExpertBanks]) -> None:
    """Advise the not yet written ``banks`` to take small pages on their first touch."""
    advise_huge_pages(_tensors(banks), MADV_NOHUGEPAGE)


def collapse_banks(banks: Sequence[ExpertBanks], progress: LoadProgress | None = None) -> int:
    """Collapse the filled ``banks`` into 2 MiB pages now (the ``huge pages`` load stage, over
    the bytes of their whole 2 MiB pages).

    Returns:
        bytes now on 2 MiB pages (0 where ``MADV_COLLAPSE`` is not available).
    """
    tensors = _tensors(banks)
    total = sum(size for _address, size in huge_spans(tensors))
    if total == 0:
        return 0
    done = 0

    def collapsed(nbytes: int) -> None:
        nonlocal done
        done += nbytes
        report_stage(progress, "huge pages", done, total)

    report_stage(progress, "huge pages", 0, total)
    result = collapse_huge_pages(tensors, progress=collapsed)
    if done < total:  # MADV_COLLAPSE unavailable: the stage ends here all the same
        report_stage(progress, "huge pages", total, total)
    return result


class BackgroundCollapse:
    """Collapses the filled ``banks`` into 2 MiB pages in a daemon thread (``threads`` workers,
    default one per CPU) and logs one line when done. The CPU expert kernel may read the banks
    meanwhile: a collapse swaps one 2 MiB range's pages at a time under the page-table lock, so
    a reader of that range waits for its copy and reads the same bytes.

    Attributes:
        total: bytes of the banks' whole 2 MiB pages.
        collapsed: bytes on 2 MiB pages once done (None while running).
        seconds: how long it took (None while running).
    """

    def __init__(self, banks: Sequence[ExpertBanks], threads: int | None = None) -> None:
        self._tensors = _tensors(banks)
        self.total = sum(size for _address, size in huge_spans(self._tensors))
        self.collapsed: int | None = None
        self.seconds: float | None = None
        self._stop = threading.Event()
        self._threads = threads
        self._thread = threading.Thread(target=self._run, name="freetoken-huge-pages",
                                        daemon=True)
        self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (None: until done); True once done."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self) -> None:
        """Leave the pieces not yet started on small pages (the thread ends after its current
        ones)."""
        self._stop.set()

    def _run(self) -> None:
        started = time.perf_counter()
        collapsed = collapse_huge_pages(self._tensors, self._threads, stop=self._stop)
        self.seconds = time.perf_counter() - started
        self.collapsed = collapsed
        self._tensors = []  # the banks' memory is the runtime's to free
        logger.info("expert banks: %s of %s on 2 MiB pages (collapsed in the background in "
                    "%.1f s)", format_bytes(collapsed), format_bytes(self.total), self.seconds)


def _tensors(banks: Sequence[ExpertBanks]) -> list:
    return [t for b in banks for t in bank_tensors(b).values()]
