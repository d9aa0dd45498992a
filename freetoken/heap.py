"""Keep freed host memory for reuse, so a prefill's temporaries do not page-fault every step.

glibc serves an allocation above its mmap threshold (dynamic, at most 32 MiB) with a fresh
``mmap`` and unmaps it on free, and it returns the heap's free top to the OS past its trim
threshold; every such buffer is faulted in again, 4 KiB at a time, by the next forward. A
prefill chunk's activations, router tables and attention scores reach tens of MiB: on the
small qwen3_next preset (bf16) a fresh process's first 922-token prefill took ~130k minor faults
and each later one ~105k. With both thresholds raised (``mallopt``) after loading: ~46k, then
~2k. Elsewhere (not glibc) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1  # <malloc.h>
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 64 << 20  # bytes: allocations below come from the heap
TRIM_THRESHOLD = 1 << 30  # bytes of free heap top kept instead of returned to the OS


def keep_freed_heap(mmap_threshold: int = MMAP_THRESHOLD,
                    trim_threshold: int = TRIM_THRESHOLD) -> bool:
    """Set glibc's mmap and trim thresholds for this process (``mallopt``).

    Call it after the weights are loaded: they keep their own mappings (and huge-page advice),
    only later allocations are affected.

    Returns:
        True when both were set; False off Linux, without a C library exporting ``mallopt``,
        or when glibc refused a value (then the second is not tried).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and \
        bool(mallopt(M_TRIM_THRESHOLD, trim_threshold))
