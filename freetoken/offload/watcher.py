"""Memory watcher: shrinks the device expert cache when free memory on its device drops below a
floor, and grows it back toward the requested size when the memory returns (issue 3, live resize).

The expert cache is the only elastic consumer of device memory (KV pages, recurrent-state
checkpoints and activations are not); another process on the same GPU, or a burst of KV
allocation, can leave too little. Every ``check_every`` steps, at a step boundary (so never in
the middle of a forward), the watcher reads the device's free bytes and:

* ``free < floor``: shrinks the cache by the deficit rounded up to whole slots (never below
  ``min_slots``), keeping the best-scored residents;
* ``free >= floor + headroom`` while the cache is below the size the operator asked for (at load
  or through ``POST /v1/freetoken/memory``): grows it by what fits above ``floor + headroom``, up
  to that size. ``headroom`` (default: one slot plus 10% of the floor) keeps a shrink and a grow
  from alternating.

Both resizes run in the cache's low-peak mode (``ExpertCache.resize(..., reload=True)``): the old
pool is freed before the new one is allocated and the kept experts are copied back from the host
banks, so device memory never holds both pools at once. On CUDA the caching allocator's free
blocks are then returned to the driver (``torch.cuda.empty_cache``), or ``mem_get_info`` would keep
reporting the memory as used. Outputs stay exact across a resize (every slot holds bank values).

Free memory (:func:`free_memory_probe`): ``torch.cuda.mem_get_info`` on CUDA; on a CPU "device"
the expert cache is host memory, so ``MemAvailable`` of ``/proc/meminfo``. The watcher reads it
only at step boundaries, so an idle server does not react until its next request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch

from freetoken.offload.control import ResizeResult
from freetoken.units import format_bytes

logger = logging.getLogger("freetoken.offload")
DEFAULT_CHECK_EVERY = 16  # steps between two reads of free memory
MEMINFO = Path("/proc/meminfo")


def _meminfo(field: str, path: Path = MEMINFO) -> int:
    """``field`` (``MemAvailable``, ``MemTotal``) of ``/proc/meminfo`` in bytes.

    Raises:
        OSError: the file cannot be read; ValueError: it has no such line.
    """
    for line in path.read_text(encoding="ascii").splitlines():
        if line.startswith(field + ":"):
            parts = line.split()
            return int(parts[1]) * (1024 if parts[2:3] == ["kB"] else 1)
    raise ValueError(f"{path} has no {field} line")


def _mem_available(path: Path = MEMINFO) -> int:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (see :func:`_meminfo`)."""
    return _meminfo("MemAvailable", path)


def total_memory(device: torch.device | str) -> int | None:
    """Total bytes of ``device``'s memory (CUDA: ``mem_get_info``; CPU: ``MemTotal``), or None."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[1])
    if device.type == "cpu" and MEMINFO.is_file():
        return _meminfo("MemTotal")
    return None


def free_memory_probe(device: torch.device | str) -> Callable[[], int] | None:
    """A zero-argument function returning free bytes on ``device``, or None when unknown.

    CUDA: ``torch.cuda.mem_get_info(device)[0]``; CPU: ``MemAvailable`` of ``/proc/meminfo``
    (None when that file is missing, e.g. not Linux).
    """
    device = torch.device(device)
    if device.type == "cuda":
        return lambda: int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu" and MEMINFO.is_file():
        return _mem_available
    return None


class MemoryWatcher:
    """Keeps ``floor_bytes`` of device memory free by resizing the expert cache between steps.

    Args:
        runtime: the offload runtime (``resize_now``, ``cache``, ``requested_slots``).
        floor_bytes: free bytes to keep on the device (> 0).
        probe: returns the device's free bytes (:func:`free_memory_probe`).
        check_every: steps between two checks (>= 1); the first check is on the first step.
        min_slots: never shrink below this many slots (>= 1).
        headroom_bytes: free bytes above the floor needed before growing; None = one slot plus
            10% of the floor.
        release: called after each resize to return freed memory to the device
            (``torch.cuda.empty_cache`` on CUDA); None = nothing.

    Attributes:
        shrinks, grows: resizes done by the watcher.

    Raises:
        ValueError: ``floor_bytes`` < 1, ``check_every`` < 1 or ``min_slots`` < 1.
    """

    def __init__(self, runtime, floor_bytes: int, probe: Callable[[], int],
                 check_every: int = DEFAULT_CHECK_EVERY, min_slots: int = 1,
                 headroom_bytes: int | None = None,
                 release: Callable[[], None] | None = None) -> None:
        if floor_bytes < 1:
            raise ValueError(f"memory floor must be a positive number of bytes, got {floor_bytes}")
        if check_every < 1 or min_slots < 1:
            raise ValueError("check_every and min_slots must be >= 1")
        self.runtime = runtime
        self.floor = int(floor_bytes)
        self.probe = probe
        self.check_every = check_every
        self.min_slots = min_slots
        slot = runtime.cache.slot_bytes
        self.headroom = int(headroom_bytes) if headroom_bytes is not None else slot + self.floor // 10
        self.release = release
        self.shrinks = 0
        self.grows = 0
        self._steps = 0

    def target_slots(self, free: int) -> int:
        """The slot count the cache should have with ``free`` bytes free (the current count when
        no resize is due)."""
        cache = self.runtime.cache
        slot, current = cache.slot_bytes, cache.num_slots
        if free < self.floor:
            deficit_slots = -(-(self.floor - free) // slot)
            return max(min(self.min_slots, current), current - deficit_slots)
        wanted = self.runtime.requested_slots
        spare = free - self.floor - self.headroom
        if current < wanted and spare >= slot:
            return min(wanted, current + spare // slot)
        return current

    def check(self) -> ResizeResult | None:
        """Called at every step boundary; every ``check_every`` steps reads free memory and
        resizes when due. Returns the applied resize, or None."""
        self._steps += 1
        if (self._steps - 1) % self.check_every:
            return None
        free = int(self.probe())
        current = self.runtime.cache.num_slots
        target = self.target_slots(free)
        if target == current:
            return None
        result = self.runtime.cache.resize(target, reload=True)
        if self.release is not None:
            self.release()
        if target < current:
            self.shrinks += 1
            what = "below"
        else:
            self.grows += 1
            what = "back above"
        logger.warning("free device memory %s %s the %s floor: expert cache %d -> %d slots (%s), "
                       "kept %d experts", format_bytes(max(free, 0)), what,
                       format_bytes(self.floor), result.old_slots, result.new_slots,
                       format_bytes(result.cache_bytes), result.kept)
        return result
