"""The device expert cache: one pool of S whole-expert slots shared by every MoE layer (paper §3.2).

Each slot holds one complete expert (its ``gate_up`` and ``down`` rows, in the compute dtype, and
for gpt-oss its fp32 biases). A
residency table maps flat id -> slot (``slot_of [N]``, -1 if absent) and slot -> flat id
(``id_of [S]``, -1 if empty); the two are always inverse.

Per MoE layer and step, :meth:`ExpertCache.plan` runs the control path as tensor operations on the
cache's device (no per-expert Python loop): deduplicate the routed ids, classify hits and misses,
ask the miss split how many misses to fill, choose which (most routed tokens first, ties to the
lower id), pick every victim in one pass over the slots (empty slots first, then the lowest
eviction score; slots holding this group's hits are pinned), update both tables, and rewrite the
routed ids into slot ids or ``-1`` (the CPU mark). :meth:`ExpertCache.fill` then copies the
chosen bank rows into their slots. Only the group's counts (hits, misses) cross to the host, to
size the split. This is the reference a later GPU issue fuses into one kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from freetoken.models.moe_forward import ClampedSwiGLU
from freetoken.offload.banks import ExpertBanks
from freetoken.offload.control import ResizeResult
from freetoken.offload.scores import EvictionScores

# (misses m, fillable slots, hits h, tokens T) -> q in [0, min(m, slots)]
ChooseFills = Callable[[int, int, int, int], int]


def slot_bytes(hidden: int, intermediate: int, dtype: torch.dtype) -> int:
    """Bytes of one cache slot: a whole expert (``gate_up [2I, H]`` + ``down [H, I]``) in ``dtype``."""
    return 3 * intermediate * hidden * torch.empty(0, dtype=dtype).element_size()


@dataclass(frozen=True)
class CachePlan:
    """Routing of one MoE layer for one step after the control path ran.

    Attributes:
        flat_ids: ``[T, k]`` int64 flat ids ``l * E + e`` of the routed experts.
        slot_ids: ``[T, k]`` int64 cache slot of each entry, ``-1`` where the CPU computes it.
        fill_ids: ``[q]`` int64 flat ids to copy into the cache.
        fill_slots: ``[q]`` int64 slots they go to.
        distinct: u, distinct routed experts of the group.
        hits: h, distinct experts resident before the group.
        fills: q.
        evictions: fills that replaced a resident expert.
    """

    flat_ids: torch.Tensor
    slot_ids: torch.Tensor
    fill_ids: torch.Tensor
    fill_slots: torch.Tensor
    distinct: int
    hits: int
    fills: int
    evictions: int

    @property
    def misses(self) -> int:
        """m = u - h."""
        return self.distinct - self.hits

    @property
    def cpu_experts(self) -> int:
        """Misses left to the CPU branch (``m - q``)."""
        return self.misses - self.fills


class ExpertCache:
    """S slots of whole experts on ``device``, filled from :class:`ExpertBanks`.

    Args:
        banks: the host banks (source of truth).
        num_slots: S, 1 <= S <= N.
        device: where the pool and tables live.
        dtype: compute dtype of the pool (bank rows are cast on fill).
        scores: eviction score keeper (``freetoken.offload.scores``).

    Raises:
        ValueError: S outside ``[1, N]``.
    """

    def __init__(self, banks: ExpertBanks, num_slots: int, device: torch.device,
                 dtype: torch.dtype, scores: EvictionScores) -> None:
        self.banks = banks
        self.device = torch.device(device)
        self.dtype = dtype
        self.scores = scores
        self._check_slots(num_slots)
        n = banks.num_ids
        self.slot_of = torch.full((n,), -1, dtype=torch.int64, device=self.device)
        self._allocate(num_slots)

    def _check_slots(self, num_slots: int) -> None:
        if not 1 <= num_slots <= self.banks.num_ids:
            raise ValueError(f"expert cache size must be in [1, {self.banks.num_ids}] slots, "
                             f"got {num_slots}")

    def _allocate(self, num_slots: int) -> None:
        b = self.banks
        self.gate_up = torch.empty(num_slots, 2 * b.intermediate, b.hidden, dtype=self.dtype,
                                   device=self.device)
        self.down = torch.empty(num_slots, b.hidden, b.intermediate, dtype=self.dtype,
                                device=self.device)
        self.gate_up_bias = self.down_bias = None
        if b.biased:  # gpt-oss: each slot's biases beside its weights, fp32
            self.gate_up_bias = torch.zeros(num_slots, 2 * b.intermediate, device=self.device)
            self.down_bias = torch.zeros(num_slots, b.hidden, device=self.device)
        self.id_of = torch.full((num_slots,), -1, dtype=torch.int64, device=self.device)

    def activation(self) -> ClampedSwiGLU | None:
        """gpt-oss's biased, clamped MLP over the slots, or None for plain SwiGLU experts."""
        if self.gate_up_bias is None:
            return None
        return ClampedSwiGLU(self.gate_up_bias, self.down_bias, *self.banks.swiglu)

    @property
    def num_slots(self) -> int:
        """S."""
        return self.id_of.shape[0]

    @property
    def slot_bytes(self) -> int:
        """Bytes of one slot (one whole expert in the compute dtype)."""
        return slot_bytes(self.banks.hidden, self.banks.intermediate, self.dtype)

    @property
    def occupancy(self) -> int:
        """Filled slots."""
        return int((self.id_of >= 0).sum())

    def resident_ids(self) -> torch.Tensor:
        """Sorted int64 flat ids currently held."""
        return torch.sort(self.id_of[self.id_of >= 0]).values

    def plan(self, layer: int, topk_ids: torch.Tensor, choose: ChooseFills) -> CachePlan:
        """Run the control path for MoE layer ``layer`` and update the residency tables.

        Args:
            layer: MoE layer ordinal l.
            topk_ids: ``[T, k]`` int64 expert ids in ``[0, E)`` on the cache's device.
            choose: the miss split, called once with ``(m, S - h, h, T)``.

        Returns:
            the plan; call :meth:`fill` with it before computing on the returned slots.
        """
        flat = topk_ids + layer * self.banks.num_experts  # [T, k]
        uniq, inverse = torch.unique(flat, sorted=True, return_inverse=True)  # [u], [T, k]
        slots = self.slot_of[uniq]  # [u]
        hit = slots >= 0
        u, h = uniq.numel(), int(hit.sum())
        self.scores.touch(uniq)
        q = choose(u - h, self.num_slots - h, h, topk_ids.shape[0])
        fill_ids = uniq[:0]
        victims = slots[:0]
        evictions = 0
        if q > 0:
            miss_pos = torch.nonzero(~hit).flatten()  # [m], ascending id
            if q < miss_pos.numel():
                counts = torch.bincount(inverse.flatten(), minlength=u)[miss_pos]
                miss_pos = miss_pos[torch.sort(-counts, stable=True).indices[:q]]
            fill_ids = uniq[miss_pos]
            victims = self._victims(q, slots[hit])
            evicted = self.id_of[victims]
            held = evicted >= 0
            evictions = int(held.sum())
            self.slot_of[evicted[held]] = -1
            self.slot_of[fill_ids] = victims
            self.id_of[victims] = fill_ids
        self.scores.end_group()
        return CachePlan(flat, self.slot_of[flat], fill_ids, victims, u, h, q, evictions)

    def _victims(self, q: int, pinned_slots: torch.Tensor) -> torch.Tensor:
        """``q`` slots in one pass: empty first, then lowest score; pinned slots never."""
        score = torch.full((self.num_slots,), float("-inf"), dtype=torch.float64,
                           device=self.device)
        full = self.id_of >= 0
        score[full] = self.scores.score(self.id_of[full])
        score[pinned_slots] = float("inf")
        return torch.sort(score, stable=True).indices[:q]

    def fill(self, plan: CachePlan) -> None:
        """Copy the plan's bank rows into their slots (asynchronous DMA from pinned banks)."""
        if plan.fills == 0:
            return
        self._copy_rows(plan.fill_ids.tolist(), plan.fill_slots.tolist())

    def _copy_rows(self, ids: list[int], slots: list[int]) -> None:
        b = self.banks
        if not ids:
            return
        non_blocking = b.pinned and self.device.type == "cuda"
        if b.biased:
            index = torch.tensor(ids, dtype=torch.int64)
            at = torch.tensor(slots, dtype=torch.int64, device=self.device)
            self.gate_up_bias.index_copy_(0, at, b.gate_up_bias.index_select(0, index).to(
                self.device))
            self.down_bias.index_copy_(0, at, b.down_bias.index_select(0, index).to(self.device))
        if b.view is not None:  # 4-bit banks: move the codes, dequantise on the device
            gate_up, down = b.rows(ids, self.device, non_blocking=non_blocking)
            index = torch.tensor(slots, dtype=torch.int64, device=self.device)
            self.gate_up.index_copy_(0, index, gate_up.to(self.dtype))
            self.down.index_copy_(0, index, down.to(self.dtype))
            return
        for n, s in zip(ids, slots):
            self.gate_up[s].copy_(b.gate_up[n], non_blocking=non_blocking)
            self.down[s].copy_(b.down[n], non_blocking=non_blocking)

    def preload(self, ids: torch.Tensor) -> None:
        """Empty the cache, then hold ``ids`` (distinct, at most S) in slots ``0..n-1``.

        Not an access: no policy clock moves. Raises ValueError for too many or repeated ids.
        """
        ids = ids.to(device=self.device, dtype=torch.int64)
        if ids.numel() > self.num_slots or torch.unique(ids).numel() != ids.numel():
            raise ValueError(f"preload needs at most {self.num_slots} distinct ids")
        self.slot_of.fill_(-1)
        self.id_of.fill_(-1)
        n = ids.numel()
        self.id_of[:n] = ids
        self.slot_of[ids] = torch.arange(n, device=self.device)
        self._copy_rows(ids.tolist(), list(range(n)))

    def resize(self, num_slots: int, reload: bool = False) -> ResizeResult:
        """Reallocate the pool with ``num_slots`` slots, keeping the highest-scored residents.

        Everything else in the engine is untouched; kept experts stay in slots ``0..k-1`` in
        their old slot order.

        Args:
            num_slots: the new S.
            reload: False: kept experts are copied device-to-device (banks are not read; peak
                device memory is the old plus the new pool). True (low-peak mode, used under
                memory pressure): the old pool is freed first and the kept experts are copied
                again from the host banks (peak = the larger pool; costs ``k`` fills).

        Raises:
            ValueError: ``num_slots`` outside ``[1, N]``.
        """
        self._check_slots(num_slots)
        old = self.num_slots
        full = torch.nonzero(self.id_of >= 0).flatten()
        score = self.scores.score(self.id_of[full])
        keep = full[torch.sort(-score, stable=True).indices[:num_slots]]
        keep = torch.sort(keep).values  # keep slot order for determinism
        kept_ids = self.id_of[keep]
        k = keep.numel()
        if reload:  # drop the old pool before allocating the new one
            self.gate_up = self.down = self.gate_up_bias = self.down_bias = None
            self._allocate(num_slots)
            self._copy_rows(kept_ids.tolist(), list(range(k)))
        else:
            pools = (self.gate_up, self.down, self.gate_up_bias, self.down_bias)
            self._allocate(num_slots)
            if k:
                new = (self.gate_up, self.down, self.gate_up_bias, self.down_bias)
                for before, after in zip(pools, new):
                    if before is not None:
                        after[:k] = before[keep]
            del pools
        self.slot_of.fill_(-1)
        self.id_of[:k] = kept_ids
        self.slot_of[kept_ids] = torch.arange(k, device=self.device)
        return ResizeResult(old, num_slots, self.slot_bytes, k)

    def check_invariants(self) -> None:
        """Raise AssertionError unless ``slot_of`` and ``id_of`` are inverse and the held rows
        equal the bank rows they name (cast to the pool dtype)."""
        held_slots = torch.nonzero(self.id_of >= 0).flatten()
        held = self.id_of[held_slots]
        assert torch.unique(held).numel() == held.numel(), "an id sits in two slots"
        assert torch.equal(self.slot_of[held], held_slots), "slot_of and id_of disagree"
        assert int((self.slot_of >= 0).sum()) == held.numel(), "slot_of names an empty slot"
        for s, n in zip(held_slots.tolist(), held.tolist()):
            gate_up, down = self.banks.rows([n])
            assert torch.equal(self.gate_up[s].cpu(), gate_up[0].to(self.dtype)), s
            assert torch.equal(self.down[s].cpu(), down[0].to(self.dtype)), s
            if self.gate_up_bias is not None:
                assert torch.equal(self.gate_up_bias[s].cpu(), self.banks.gate_up_bias[n]), s
                assert torch.equal(self.down_bias[s].cpu(), self.banks.down_bias[n]), s
