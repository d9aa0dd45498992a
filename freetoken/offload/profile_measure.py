"""Timed loops behind :func:`freetoken.offload.profile.measure_profile`: B_P and B_H in GB/s.

Both walk the banks in a seeded random permutation (no expert re-read before the whole bank has
been) and report rates from median times, which resist stalls from other processes sharing the
cores. GB/s = 1e9 B/s.
"""

from __future__ import annotations

import statistics
import time

import torch

COPY_BATCHES = (1, 4, 8)


def banks(n: int, hidden: int, inter: int, dtype: torch.dtype, pin: bool):
    """Host banks ``(gate_up [n, 2I, H], down [n, H, I])`` of ``dtype``, pinned when ``pin``,
    filled with 0.01 (every page written, so reads come from memory; no denormals)."""
    gate_up = torch.empty(n, 2 * inter, hidden, dtype=dtype, pin_memory=pin).fill_(0.01)
    down = torch.empty(n, hidden, inter, dtype=dtype, pin_memory=pin).fill_(0.01)
    return gate_up, down


def _order(n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=gen).tolist()


def measure_copy(gate_up: torch.Tensor, down: torch.Tensor, device: str, seconds: float) -> float:
    """B_P in GB/s: whole experts copied row by row from the banks into a pool on ``device``.

    Args:
        gate_up, down: host banks ``[N, 2I, H]`` / ``[N, H, I]`` (pinned for CUDA).
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:i"``.
        seconds: wall-clock budget (at least one pass over every batch size is timed).

    Returns:
        ``sum(batches) * expert bytes / sum(median time per batch size)`` (medians resist
        stalls from other processes sharing the cores).
    """
    n = gate_up.shape[0]
    slots = min(64, n)
    pool_gu = torch.empty((slots, *gate_up.shape[1:]), dtype=gate_up.dtype, device=device)
    pool_dn = torch.empty((slots, *down.shape[1:]), dtype=down.dtype, device=device)
    cuda = torch.device(device).type == "cuda"
    order, pos, slot = _order(n, 1), 0, 0
    per_expert = gate_up[0].nbytes + down[0].nbytes

    def copy(batch: int) -> None:
        nonlocal pos, slot
        for _ in range(batch):
            i = order[pos % n]
            pool_gu[slot].copy_(gate_up[i], non_blocking=cuda)
            pool_dn[slot].copy_(down[i], non_blocking=cuda)
            pos, slot = pos + 1, (slot + 1) % slots
        if cuda:
            torch.cuda.synchronize()

    threads = torch.get_num_threads()
    if not cuda:  # one copy stream: multi-threaded copies stall when another process holds a core
        torch.set_num_threads(1)
    try:
        copy(slots)  # warm-up: allocator, first touch of every pool slot
        times: dict[int, list[float]] = {b: [] for b in COPY_BATCHES}
        deadline = time.perf_counter() + seconds
        while True:
            for batch in COPY_BATCHES:
                t0 = time.perf_counter()
                copy(batch)
                times[batch].append(time.perf_counter() - t0)
            if time.perf_counter() >= deadline:
                break
    finally:
        torch.set_num_threads(threads)
    moved = sum(COPY_BATCHES) * per_expert
    return moved / sum(statistics.median(t) for t in times.values()) / 1e9


def _kernel_submit(gate_up: torch.Tensor, down: torch.Tensor):
    """``f(x, token_ids, expert_ids, weights) -> handle`` on these banks: ``cpu.submit_banks``
    (bf16 and fp32 banks) where the kernel has it, else ``cpu.submit`` (bf16 only).

    Raises:
        TypeError: a bank dtype the kernel cannot read.
    """
    from freetoken.ops.cpu_moe import cpu

    if hasattr(cpu, "submit_banks"):
        from freetoken.ops.cpu_moe.formats import ExpertBankView

        banks = ExpertBankView.dense(gate_up, down)
        return lambda x, t, e, w: cpu.submit_banks(x, t, e, w, banks)
    return lambda x, t, e, w: cpu.submit(x, t, e, w, gate_up, down)


def measure_kernel(gate_up: torch.Tensor, down: torch.Tensor, top_k: int, seconds: float) -> float:
    """B_H in GB/s: the CPU kernel on one fp32 token routed to ``top_k`` distinct experts per call.

    Args:
        gate_up, down: host banks ``[N, 2I, H]`` / ``[N, H, I]`` of a dtype the kernel accepts.
        top_k: experts per call (the model's ``num_experts_per_tok``, at most N).
        seconds: wall-clock budget (at least three calls are timed).

    Returns:
        ``top_k * expert bytes / median call time``.

    Raises:
        TypeError: the kernel rejects the banks' dtype.
    """
    n, hidden = gate_up.shape[0], gate_up.shape[2]
    k = min(top_k, n)
    x = torch.full((1, hidden), 0.01)
    token_ids = torch.zeros(k, dtype=torch.int64)
    weights = torch.full((k,), 1.0 / k)
    order, pos = torch.tensor(_order(n, 2), dtype=torch.int64), 0
    per_call = k * (gate_up[0].nbytes + down[0].nbytes)

    submit = _kernel_submit(gate_up, down)

    def call() -> None:
        nonlocal pos
        ids = order[torch.arange(pos, pos + k) % n]
        pos += k
        submit(x, token_ids, ids, weights).wait()

    call()  # warm-up: starts the thread pool; raises TypeError for an unsupported dtype
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(times) < 3 or time.perf_counter() < deadline:
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return per_call / statistics.median(times) / 1e9
