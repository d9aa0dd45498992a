"""Host expert banks are filled on small pages and collapsed into 2 MiB pages once final.

The first touch of a fresh 2 MiB page can cost more than reading its bytes from disk: in a VM
whose host backs guest memory page by page on first touch (and takes freed memory back), this
dev machine faults fresh 2 MiB pages in at ~0.4 GB/s per thread but 4 KiB pages at ~2.6 GB/s,
so a pool advised to huge pages before the load made the packed load wait on its page faults.
The banks are therefore written on small pages, and once they hold their final bytes (after a
quantisation at load, before pinning: pinned pages cannot move) ``MADV_COLLAPSE`` copies them
into 2 MiB pages, which the decode kernels stream faster (``freetoken.huge_pages``).
"""

from __future__ import annotations

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


def fill_on_small_pages(banks: Sequence[ExpertBanks]) -> None:
    """Advise the not yet written ``banks`` to take small pages on their first touch."""
    advise_huge_pages([t for b in banks for t in bank_tensors(b).values()], MADV_NOHUGEPAGE)


def collapse_banks(banks: Sequence[ExpertBanks], progress: LoadProgress | None = None) -> int:
    """Collapse the filled ``banks`` into 2 MiB pages (the ``huge pages`` load stage, over the
    bytes of their whole 2 MiB pages).

    Returns:
        bytes now on 2 MiB pages (0 where ``MADV_COLLAPSE`` is not available).
    """
    tensors = [t for b in banks for t in bank_tensors(b).values()]
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
