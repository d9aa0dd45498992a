"""What /proc/self/smaps and sysfs say about transparent huge pages (test helpers)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def anon_huge_in(address: int, size: int) -> int:
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


def collapse_supported() -> bool:
    """THP not ``never`` and Linux >= 6.1 (MADV_COLLAPSE)."""
    if not sys.platform.startswith("linux") or not THP.exists():
        return False
    if re.search(r"\[(\w+)\]", THP.read_text())[1] == "never":
        return False
    major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    return (major, minor) >= (6, 1)
