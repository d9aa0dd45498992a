"""The offloaded MoE runtime: routed experts of every MoE layer through one device expert cache.

Per MoE layer and step (FreeToken paper §3.2-3.3, :meth:`OffloadRuntime.forward`):

1. the cache's control path classifies the routed experts and plans q fills (``cache.plan``);
2. the CPU branch is submitted for the ``m - q`` misses (C++ kernel, asynchronous);
3. the device branch copies the q fills into their slots and computes every cached entry;
4. the CPU partial sums are waited for and added: ``out = device part + CPU part`` (the shared
   expert is added by the MoE block), exact up to fp32 summation order;
5. the split learns from both branch durations; per-layer counters are updated.

Step boundaries (:meth:`begin_step` / :meth:`end_step`, called by the model runner around each
forward) advance the policy clock and apply a pending :meth:`resize_expert_cache`, so a resize
lands between two steps while requests keep running; an optional memory watcher
(``freetoken.offload.watcher``) may shrink or regrow the cache there too.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import torch

from freetoken.models.moe_forward import grouped_swiglu
from freetoken.offload.banks import ExpertBanks
from freetoken.offload.cache import ExpertCache
from freetoken.offload.control import LayerStats, MoeStats, ResizeResult
from freetoken.offload.cpu_branch import CpuBranch
from freetoken.offload.split import MissSplit

logger = logging.getLogger("freetoken.offload")
_COUNTERS = ("steps", "hits", "misses", "fills", "cpu_experts", "evictions")


class _BranchTimer:
    """Seconds of device work: CUDA events on a GPU, wall clock elsewhere."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def start(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def stop(self, started) -> float:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            end.synchronize()
            return started.elapsed_time(end) / 1000.0
        return time.perf_counter() - started


class OffloadRuntime:
    """Implements ``MoeRuntimeControl`` and the routed-expert forward of every MoE layer.

    Args:
        banks: host expert banks (filled by the checkpoint loader).
        cache: the device expert cache over ``banks``.
        split: the miss split (its mode encodes the backend: ``offload`` = all-fill,
            ``cpu`` = all-cpu, ``hybrid`` = split).
        backend: backend name reported in stats.
        bandwidths: profiled ``(B_P, B_H)`` in GB/s, or None.
        log_every: log a one-line summary every this many steps (0 = never).
        cpu_activations: the CPU branch's kernel activations, ``"fp32"`` or ``"q8"`` (4-bit
            banks; see ``MoeConfig.cpu_activations``).
    """

    def __init__(self, banks: ExpertBanks, cache: ExpertCache, split: MissSplit, backend: str,
                 bandwidths: tuple[float, float] | None = None, log_every: int = 0,
                 cpu_activations: str = "fp32") -> None:
        self.banks, self.cache, self.split, self.backend = banks, cache, split, backend
        self.bandwidths = bandwidths
        self.log_every = log_every
        self.cpu = CpuBranch(banks, cpu_activations)
        self._timer = _BranchTimer(cache.device)
        n = banks.num_layers
        self._counts = {name: np.zeros(n, np.int64) for name in _COUNTERS}
        self._device_s = np.zeros(n)
        self._cpu_s = np.zeros(n)
        self._lock = threading.Lock()
        self._pending: int | None = None
        self.step_index = 0
        self.requested_slots = cache.num_slots  # the size asked for (load, admin resize)
        self.watcher = None  # a freetoken.offload.watcher.MemoryWatcher, or None

    # --- forward --------------------------------------------------------------------------
    def forward(self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor,
                topk_weights: torch.Tensor) -> torch.Tensor:
        """Routed-expert output of MoE layer ``layer``.

        Args:
            layer: MoE layer ordinal.
            x: ``[T, H]`` MoE input on the cache's device (compute dtype).
            topk_ids: ``[T, k]`` int64 expert ids in ``[0, E)``.
            topk_weights: ``[T, k]`` routing weights (``x``'s dtype).

        Returns:
            ``[T, H]`` in ``x``'s dtype (shared expert not included).
        """
        plan = self.cache.plan(layer, topk_ids, self.split.choose)
        branches_started = time.perf_counter()  # the split's wall time: both branches only
        handle = None
        if plan.cpu_experts:
            on_cpu = plan.slot_ids < 0  # [T, k]
            tokens = torch.nonzero(on_cpu)[:, 0]
            handle = self.cpu.submit(
                x, tokens.cpu(), plan.flat_ids[on_cpu].cpu(),
                topk_weights[on_cpu].to(device="cpu", dtype=torch.float32),
            )
        started = self._timer.start()
        self.cache.fill(plan)
        out = grouped_swiglu(x, plan.slot_ids, topk_weights, self.cache.gate_up, self.cache.down,
                             self.cache.activation())
        device_s = self._timer.stop(started)
        cpu_s = 0.0
        if handle is not None:
            out = out + handle.wait().to(device=out.device, dtype=out.dtype)
            cpu_s = handle.seconds()
        self.split.observe(plan.fills, plan.misses, device_s, cpu_s, hits=plan.hits,
                           tokens=x.shape[0], wall_s=time.perf_counter() - branches_started)
        c = self._counts
        c["steps"][layer] += 1
        c["hits"][layer] += plan.hits
        c["misses"][layer] += plan.misses
        c["fills"][layer] += plan.fills
        c["cpu_experts"][layer] += plan.cpu_experts
        c["evictions"][layer] += plan.evictions
        self._device_s[layer] += device_s
        self._cpu_s[layer] += cpu_s
        return out

    # --- step boundaries ------------------------------------------------------------------
    def begin_step(self) -> None:
        """Before a model forward: apply a pending resize, start the policy's step."""
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            result = self.resize_now(pending)
            logger.info("expert cache resized: %d -> %d slots (%.1f MiB), kept %d experts",
                        result.old_slots, result.new_slots, result.cache_bytes / 2**20,
                        result.kept)
        if self.watcher is not None:
            self.watcher.check()
        self.cache.scores.begin_step()

    def end_step(self) -> None:
        """After a model forward: advance the policy's step clock; log every ``log_every``."""
        self.cache.scores.end_step()
        self.step_index += 1
        if self.log_every and self.step_index % self.log_every == 0:
            logger.info("%s", self.summary())

    def summary(self) -> str:
        """One line: hit rate, fills, CPU experts, q mean, branch seconds since start."""
        c = {k: int(v.sum()) for k, v in self._counts.items()}
        routed = c["hits"] + c["misses"]
        rate = c["hits"] / routed if routed else 0.0
        return (f"moe {self.backend}: {self.cache.num_slots} slots, hit rate {rate:.3f} "
                f"({c['hits']}/{routed}), fills {c['fills']}, cpu experts {c['cpu_experts']}, "
                f"evictions {c['evictions']}, filled {self.split.fill_fraction:.3f} of misses, "
                f"device {self._device_s.sum():.2f}s, cpu {self._cpu_s.sum():.2f}s")

    # --- control (MoeRuntimeControl) ------------------------------------------------------
    def slots_for_bytes(self, num_bytes: int) -> int:
        """Whole slots in ``num_bytes``, clamped to ``[1, N]``.

        Raises:
            ValueError: ``num_bytes`` < 1.
        """
        if isinstance(num_bytes, bool) or not isinstance(num_bytes, int) or num_bytes < 1:
            raise ValueError(f"expert cache size must be a positive number of bytes, got {num_bytes!r}")
        return max(1, min(self.banks.num_ids, num_bytes // self.cache.slot_bytes))

    def resize_expert_cache(self, num_bytes: int) -> None:
        """Ask for a cache of ``num_bytes``; applied at the next step boundary (thread-safe).

        Raises:
            ValueError: ``num_bytes`` < 1.
        """
        self.slots_for_bytes(num_bytes)
        with self._lock:
            self._pending = num_bytes

    def resize_now(self, num_bytes: int) -> ResizeResult:
        """Resize at once (engine thread, between steps); keeps the best-scored residents. The
        new size becomes the one a memory watcher grows back to.

        Raises:
            ValueError: ``num_bytes`` < 1.
        """
        result = self.cache.resize(self.slots_for_bytes(num_bytes))
        self.requested_slots = result.new_slots
        return result

    def stats(self) -> MoeStats:
        """Snapshot of configuration and per-layer counters."""
        layers = tuple(
            LayerStats(layer=l, **{k: int(v[l]) for k, v in self._counts.items()},
                       q_sum=int(self._counts["fills"][l]),  # q of a layer call = its fills
                       device_s=float(self._device_s[l]), cpu_s=float(self._cpu_s[l]))
            for l in range(self.banks.num_layers)
        )
        with self._lock:
            pending = self._pending
        bp, bh = self.bandwidths if self.bandwidths else (None, None)
        return MoeStats(
            backend=self.backend, policy=self.cache.scores.name, device=str(self.cache.device),
            num_slots=self.cache.num_slots, slot_bytes=self.cache.slot_bytes,
            total_experts=self.banks.num_ids, bank_bytes=self.banks.nbytes,
            banks_pinned=self.banks.pinned, split_ratio=self.split.fill_fraction,
            bandwidth_p_gbps=bp, bandwidth_h_gbps=bh, pending_resize_bytes=pending, layers=layers,
            memory_floor_bytes=self.watcher.floor if self.watcher else None,
            watcher_shrinks=self.watcher.shrinks if self.watcher else 0,
            watcher_grows=self.watcher.grows if self.watcher else 0,
            expert_format=self.banks.format, cpu_activations=self.cpu.activations,
        )
