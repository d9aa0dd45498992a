"""``freetoken.heap.keep_freed_heap``: after it, freed buffers above glibc's default mmap
ceiling (32 MiB) are largely reused from the heap, so the next step's allocations cost fewer page
faults; without it, every such allocation is a fresh mapping faulted in page by page. Each case
runs in a fresh interpreter, since the setting is process-wide."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import resource, sys, torch
from freetoken.heap import keep_freed_heap
if sys.argv[1] == "keep":
    assert keep_freed_heap()
def step():  # a forward's temporaries: a few buffers above 32 MiB, live together, then freed
    held = [torch.empty(mib << 20, dtype=torch.uint8).fill_(1) for mib in (40, 36, 44)]
    del held
step()  # the first step faults either way
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True,
                         check=True)
    return int(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt is Linux-only")
def test_freed_buffers_are_reused_with_at_most_half_the_page_faults() -> None:
    pages = 4 * (120 << 20) // 4096  # four steps of 4 KiB pages
    default = _faults("default")
    assert default >= pages * 9 // 10  # every buffer mapped and faulted in anew
    assert _faults("keep") <= default // 2  # mostly the same heap memory, already resident


def test_thresholds_are_accepted() -> None:
    from freetoken.heap import keep_freed_heap

    assert keep_freed_heap() is sys.platform.startswith("linux")
