"""What the outside world (HTTP admin endpoints, CLI, metrics, log) sees of the offload runtime.

The offloaded MoE runtime (``freetoken.offload.runtime``) implements :class:`MoeRuntimeControl`;
the server, ``/metrics`` and ``freetoken ctl`` talk only to this interface, so they can be tested
with a fake. Every method is called on the engine thread between two steps (the async engine's
``run_between_steps``), except :meth:`MoeRuntimeControl.resize_expert_cache`, which any thread may
call (it only records the request; the engine applies it at the next step boundary).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

MOE_BACKENDS = ("resident", "offload", "cpu", "hybrid", "auto")


@dataclass(frozen=True)
class LayerStats:
    """Counters of one MoE layer since start (all cumulative).

    Attributes:
        layer: MoE layer ordinal ``l`` (flat expert id ``l * E + e``).
        steps: forward calls of this layer (prefill chunks + decode steps).
        hits: distinct routed experts per call found in the device cache, summed over calls.
        misses: distinct routed experts per call not in the cache (``fills + cpu_experts``).
        fills: misses copied into the cache and run on the device.
        cpu_experts: misses run on the CPU from the host banks.
        evictions: fills that replaced a resident expert (fills into empty slots excluded).
        q_sum: sum over calls of the q chosen by the miss split (``q_sum / steps`` = mean q).
        device_s: seconds spent in the device branch (fills + device expert compute).
        cpu_s: seconds the CPU expert kernel ran (CPU branch).
    """

    layer: int
    steps: int = 0
    hits: int = 0
    misses: int = 0
    fills: int = 0
    cpu_experts: int = 0
    evictions: int = 0
    q_sum: int = 0
    device_s: float = 0.0
    cpu_s: float = 0.0


@dataclass(frozen=True)
class MoeStats:
    """Snapshot of the offload runtime.

    Attributes:
        backend: the active backend, one of ``offload``, ``cpu``, ``hybrid`` (``auto`` resolves
            to one of these or to ``resident``, which has no runtime).
        policy: eviction policy name (``lru``, ``lfu-decay``).
        device: the device the cache lives on (``cpu``, ``cuda:0``).
        num_slots: S, expert slots in the device cache.
        slot_bytes: bytes of one slot (one whole expert, every bank row).
        total_experts: N = MoE layers * experts per layer (the host bank rows).
        bank_bytes: bytes of all host banks.
        banks_pinned: True when the host banks are page-locked.
        split_ratio: moving average of the fraction q / m of misses filled (1 for ``offload``,
            0 for ``cpu``; what the online split currently chooses for ``hybrid``).
        bandwidth_p_gbps: profiled B_P in GB/s (1e9 bytes/s), or None without a profile.
        bandwidth_h_gbps: profiled B_H in GB/s, or None.
        pending_resize_bytes: a resize waiting for the next step boundary, or None.
        layers: per-layer counters, ordered by layer.
        memory_floor_bytes: free device bytes the memory watcher keeps, or None without one.
        watcher_shrinks: cache shrinks done by the memory watcher.
        watcher_grows: cache regrows done by the memory watcher.
        expert_format: host bank format, ``dense`` or the 4-bit ``mxfp4`` / ``q4g``.
        cpu_activations: the CPU expert kernel's activations, ``fp32`` or ``q8``.
    """

    backend: str
    policy: str
    device: str
    num_slots: int
    slot_bytes: int
    total_experts: int
    bank_bytes: int
    banks_pinned: bool
    split_ratio: float
    bandwidth_p_gbps: float | None
    bandwidth_h_gbps: float | None
    pending_resize_bytes: int | None
    layers: tuple[LayerStats, ...]
    memory_floor_bytes: int | None = None
    watcher_shrinks: int = 0
    watcher_grows: int = 0
    expert_format: str = "dense"
    cpu_activations: str = "fp32"

    @property
    def cache_bytes(self) -> int:
        """Bytes of the device expert cache (``num_slots * slot_bytes``)."""
        return self.num_slots * self.slot_bytes


@dataclass(frozen=True)
class ResizeResult:
    """Outcome of an applied expert-cache resize.

    Attributes:
        old_slots, new_slots: S before and after.
        slot_bytes: bytes per slot.
        kept: experts that stayed resident across the resize (the most valuable under the policy).
    """

    old_slots: int
    new_slots: int
    slot_bytes: int
    kept: int

    @property
    def cache_bytes(self) -> int:
        """Bytes of the cache after the resize."""
        return self.new_slots * self.slot_bytes


class MoeRuntimeControl(Protocol):
    """Control surface of the offloaded MoE runtime (implemented by ``OffloadRuntime``)."""

    def stats(self) -> MoeStats:
        """Snapshot of configuration and counters."""
        ...

    def resize_expert_cache(self, num_bytes: int) -> None:
        """Ask for a cache of ``num_bytes`` (rounded down to whole slots, at least 1 slot and at
        most the whole pool); applied at the next step boundary. Thread-safe.

        Raises:
            ValueError: ``num_bytes`` < 1.
        """
        ...

    def resize_now(self, num_bytes: int) -> ResizeResult:
        """Apply a resize immediately; only between steps on the engine thread.

        Raises:
            ValueError: ``num_bytes`` < 1.
        """
        ...


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$", re.ASCII)
MAX_BYTES = 2**62  # anything larger is a typo, not a memory size


def parse_bytes(text: str, require_unit: bool = False) -> int:
    """``"2GiB"`` / ``"1.5GB"`` / ``"512MiB"`` / ``"1048576"`` -> bytes (int, >= 1).

    Units: B, KB/MB/GB/TB (powers of 1000), KiB/MiB/GiB/TiB (powers of 1024), case-insensitive.

    Args:
        text: the size.
        require_unit: reject a bare number (``"16"`` is ambiguous where slots are also counted).

    Raises:
        ValueError: not a number with a known unit, a missing unit when required, zero, or more
            than :data:`MAX_BYTES`.
    """
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(f"invalid size {text!r}: expected a number with an optional unit "
                         "(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. 2GiB")
    if float(match.group(1)) == 0:  # whatever the unit: suggesting one would not help
        raise ValueError(f"invalid size {text!r}: must be at least 1 byte")
    if require_unit and not unit:
        number, bare = float(match.group(1)), text.strip()
        hints = [f"{bare}{u}" for u, scale in (("MiB", 2**20), ("B", 1))
                 if 1 <= number * scale <= MAX_BYTES]  # only sizes that would be accepted
        raise ValueError(f"invalid size {text!r}: give a unit, e.g. " + (
            " or ".join(hints) if hints else "MiB or GiB") + " (a bare number is ambiguous)")
    value = float(match.group(1)) * _UNITS[unit]
    if value > MAX_BYTES:
        raise ValueError(f"invalid size {text!r}: larger than {MAX_BYTES} bytes")
    value = int(value)
    if value < 1:
        raise ValueError(f"invalid size {text!r}: must be at least 1 byte")
    return value
