"""Python face of the C++ CPU expert kernel (``csrc/``, built as ``freetoken.ops.cpu_moe._ext``).

Shape letters: T tokens, H hidden, I expert intermediate, N flat expert ids ``l * E + e``,
P (token, expert, weight) triples. Math: see :mod:`freetoken.ops.cpu_moe.reference`.
"""

from __future__ import annotations

import torch

from freetoken.ops.cpu_moe import _ext

CpuMoeHandle = _ext.MoeHandle


def submit(
    x: torch.Tensor,
    token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    *,
    isa: str | None = None,
) -> CpuMoeHandle:
    """Queue the SwiGLU expert MLP on the kernel's thread pool and return at once.

    The work runs on a persistent pool of ``num_threads()`` workers (physical cores, or
    ``FREETOKEN_CPU_MOE_THREADS``) without the GIL, so the caller can launch device work and then
    call ``handle.wait()``. Submissions run one after another in submission order. The handle
    keeps ``x``, ``gate_up`` and ``down`` alive until the work is done; the caller must not write
    them before ``wait()`` returns (routing tensors are copied at submit).

    Args:
        x: ``[T, H]`` fp32 or bf16 hidden states, contiguous, CPU.
        token_ids: ``[P]`` int64 token row of each triple, in ``[0, T)``.
        expert_ids: ``[P]`` int64 flat expert id of each triple, in ``[0, N)``; ``-1`` skips it.
        weights: ``[P]`` fp32 gate (top-k) weight of each triple.
        gate_up: ``[N, 2I, H]`` bf16 host bank, rows ``[0:I]`` gate, ``[I:2I]`` up.
        down: ``[N, H, I]`` bf16 host bank.
        isa: ``"scalar"``, ``"avx2"`` or ``"avx512_bf16"``; ``None`` reads ``FREETOKEN_CPU_MOE_ISA``,
            else the best variant this CPU supports (:func:`supported_isas`).

    Returns:
        A handle whose ``wait()`` returns ``[T, H]`` fp32 gate-weighted partial sums and whose
        ``done()`` says, without blocking, whether they are ready.

    Raises:
        TypeError: an argument is not a torch.Tensor or has the wrong dtype.
        ValueError: wrong device, rank, shape agreement or contiguity; an id out of range; an
            unknown or unsupported ``isa``.
    """
    return _ext.submit(x, token_ids, expert_ids, weights, gate_up, down, isa=isa)


def cpu_moe(
    x: torch.Tensor,
    token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    *,
    isa: str | None = None,
) -> torch.Tensor:
    """``submit(...).wait()``: the blocking form; same arguments, result and errors."""
    return submit(x, token_ids, expert_ids, weights, gate_up, down, isa=isa).wait()


def supported_isas() -> tuple[str, ...]:
    """ISA variants this CPU can run, best last (``"scalar"`` is always first)."""
    return tuple(_ext.supported_isas())


def num_threads() -> int:
    """Worker threads of the process-wide kernel pool (starting it if needed)."""
    return int(_ext.num_threads())
