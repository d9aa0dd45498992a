"""Shrinks the host checkpoint tier when the machine runs low on memory (the expert cache's
``freetoken.offload.watcher`` idea, for ``CheckpointStore.resize_host``).

The engine calls :meth:`HostTierWatcher.check` before every step; it reads ``MemAvailable`` at
most once per ``interval_s`` seconds. Below ``floor`` bytes the tier's budget becomes what it
holds now less the deficit (at least 0), evicting checkpoints until it fits; once memory is back
above the floor plus a headroom (10% of the floor) the budget regrows toward its requested size
by the spare bytes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from freetoken.units import format_bytes

logger = logging.getLogger("freetoken.prefix")
DEFAULT_INTERVAL_S = 2.0


class HostTierWatcher:
    """Keeps ``floor`` bytes of host memory available by resizing ``store``'s host tier.

    Args:
        store: a ``CheckpointStore``.
        floor: ``MemAvailable`` bytes to keep (> 0; ``freetoken serve``: the plan's host reserve).
        probe: returns the available host bytes (default ``MemAvailable`` of ``/proc/meminfo``).
        interval_s: seconds between two reads of the probe.
        clock: time source (seconds).

    Attributes:
        requested: the host budget to regrow toward (the store's at construction).
        shrinks, grows, evicted: resizes done and checkpoints evicted by the watcher.
    """

    def __init__(self, store, floor: int, probe: Callable[[], int] | None = None,
                 interval_s: float = DEFAULT_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if floor < 1:
            raise ValueError(f"floor must be a positive number of bytes, got {floor}")
        if probe is None:
            from freetoken.engine.memory_plan import read_meminfo

            def probe() -> int:
                return read_meminfo()["MemAvailable"]

        self.store, self.floor, self.probe = store, int(floor), probe
        self.interval_s, self.clock = interval_s, clock
        self.requested = store.host_bytes
        self.headroom = self.floor // 10
        self.shrinks = self.grows = self.evicted = 0
        self._checked_at: float | None = None

    def target_bytes(self, available: int) -> int:
        """The host budget for ``available`` bytes of host memory (the current one when no
        resize is due)."""
        store = self.store
        current = store.host_bytes
        if available < self.floor:
            used = store.num_in("host") * store.layout.bytes_per_checkpoint()
            return max(0, min(current, used) - (self.floor - available))
        spare = available - self.floor - self.headroom
        if current < self.requested and spare > 0:
            return min(self.requested, current + spare)
        return current

    def check(self) -> int | None:
        """Between two steps: at most once per ``interval_s``, read the probe and resize when
        due. Returns the new budget when it changed, else None."""
        now = self.clock()
        if self._checked_at is not None and now - self._checked_at < self.interval_s:
            return None
        self._checked_at = now
        available = self.probe()
        old, new = self.store.host_bytes, self.target_bytes(available)
        if new == old:
            return None
        evicted = self.store.resize_host(new)
        self.evicted += evicted
        if new < old:
            self.shrinks += 1
        else:
            self.grows += 1
        logger.warning("host checkpoint tier %s -> %s (%s available, floor %s): evicted %d",
                       format_bytes(old), format_bytes(new), format_bytes(available),
                       format_bytes(self.floor), evicted)
        return new
