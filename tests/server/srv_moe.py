"""A fake offloaded-MoE runtime implementing ``MoeRuntimeControl`` for the admin-route tests."""

from __future__ import annotations

import threading

from freetoken.offload.control import LayerStats, MoeStats, ResizeResult

MIB = 2**20


class FakeMoe:
    """An expert cache of ``slots`` slots of ``slot_bytes`` over ``total_experts`` host experts.

    Records the thread of every call (``threads``) and every applied resize (``resizes``, in
    bytes). ``fail_resize`` is raised by :meth:`resize_now` when set.
    """

    def __init__(self, slots: int = 96, slot_bytes: int = 16 * MIB, total_experts: int = 4096,
                 layers: tuple[LayerStats, ...] = ()) -> None:
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.total_experts = total_experts
        self.layers = layers
        self.pending: int | None = None
        self.resizes: list[int] = []
        self.threads: list[str] = []
        self.fail_resize: Exception | None = None
        self.floor: int | None = None
        self.expert_format = "dense"
        self.cpu_activations = "fp32"

    def stats(self) -> MoeStats:
        self.threads.append(threading.current_thread().name)
        return MoeStats(
            backend="hybrid", policy="lru", device="cuda:0", num_slots=self.slots,
            slot_bytes=self.slot_bytes, total_experts=self.total_experts,
            bank_bytes=self.total_experts * self.slot_bytes, banks_pinned=True, split_ratio=0.75,
            bandwidth_p_gbps=25.0, bandwidth_h_gbps=None, pending_resize_bytes=self.pending,
            layers=self.layers, memory_floor_bytes=self.floor, expert_format=self.expert_format,
            cpu_activations=self.cpu_activations,
        )

    def resize_expert_cache(self, num_bytes: int) -> None:
        if num_bytes < 1:
            raise ValueError(f"num_bytes must be >= 1, got {num_bytes}")
        self.pending = num_bytes

    def resize_now(self, num_bytes: int) -> ResizeResult:
        self.threads.append(threading.current_thread().name)
        if self.fail_resize is not None:
            raise self.fail_resize
        if num_bytes < 1:
            raise ValueError(f"num_bytes must be >= 1, got {num_bytes}")
        old = self.slots
        self.slots = max(1, min(num_bytes // self.slot_bytes, self.total_experts))
        self.resizes.append(num_bytes)
        self.pending = None
        return ResizeResult(old_slots=old, new_slots=self.slots, slot_bytes=self.slot_bytes,
                            kept=min(old, self.slots))
