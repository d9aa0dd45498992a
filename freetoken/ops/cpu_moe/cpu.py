"""Python face of the C++ CPU expert kernel (``csrc/``, built as ``freetoken.ops.cpu_moe._ext``).

Shape letters: T tokens, H hidden, I expert intermediate, N flat expert ids ``l * E + e``,
P (token, expert, weight) triples. Math: see :mod:`freetoken.ops.cpu_moe.reference`; weight
formats: :mod:`freetoken.ops.cpu_moe.formats`.

The handle returned by :func:`submit` / :func:`submit_banks` has ``wait()`` (block with the GIL
released, return ``out [T, H]`` fp32, re-raise a kernel error), ``done()`` (never blocks) and
``seconds()``: wall seconds the job ran on the kernel's pool, measured in C++ with
``std::chrono::steady_clock`` from the start of its compute to its end (queueing behind earlier
submissions not included); ``-1.0`` until ``done()``.
"""

from __future__ import annotations

import torch

from freetoken.ops.cpu_moe import _ext
from freetoken.ops.cpu_moe.formats import ExpertBankView

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

    The work runs on a persistent pool of ``num_threads()`` threads (physical cores, or
    ``FREETOKEN_CPU_MOE_THREADS``) without the GIL, so the caller can launch device work and then
    call ``handle.wait()`` (a job that has not started by then, and is next in line, runs on the
    waiting thread and the pool's workers instead of being handed to the dispatcher thread).
    Submissions run one after another in submission order. The handle keeps ``x``, ``gate_up``
    and ``down`` alive until the work is done; the caller must not write them before ``wait()``
    returns (routing tensors are copied at submit).

    Args:
        x: ``[T, H]`` fp32 or bf16 hidden states, contiguous, CPU.
        token_ids: ``[P]`` int64 token row of each triple, in ``[0, T)``.
        expert_ids: ``[P]`` int64 flat expert id of each triple, in ``[0, N)``; ``-1`` skips it.
        weights: ``[P]`` fp32 gate (top-k) weight of each triple.
        gate_up: ``[N, 2I, H]`` bf16 or fp32 host bank, rows ``[0:I]`` gate, ``[I:2I]`` up.
        down: ``[N, H, I]`` host bank of the same dtype as ``gate_up``.
        isa: ``"scalar"``, ``"avx2"`` or ``"avx512_bf16"``; ``None`` reads ``FREETOKEN_CPU_MOE_ISA``,
            else the best variant this CPU supports (:func:`supported_isas`).

    Returns:
        A handle whose ``wait()`` returns ``[T, H]`` fp32 gate-weighted partial sums, whose
        ``done()`` says, without blocking, whether they are ready, and whose ``seconds()`` gives
        the pool's wall time for the job (``-1.0`` until done).

    Raises:
        TypeError: an argument is not a torch.Tensor or has the wrong dtype.
        ValueError: wrong device, rank, shape agreement or contiguity; ``gate_up`` and ``down``
            of different dtypes; an id out of range; an unknown or unsupported ``isa``.
    """
    return _ext.submit(x, token_ids, expert_ids, weights, gate_up, down, isa=isa)


def submit_banks(
    x: torch.Tensor,
    token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    weights: torch.Tensor,
    banks: ExpertBankView,
    *,
    isa: str | None = None,
) -> CpuMoeHandle:
    """:func:`submit` for banks in any weight format (bf16, fp32, mxfp4, q4g).

    4-bit weights are decoded inside the kernel, a 32-column block at a time (no dequantised copy
    of a matrix). Arguments other than ``banks`` and the result are as in :func:`submit`; the
    handle keeps every bank tensor alive until the work is done.

    Raises:
        TypeError: a non-tensor, or a bank tensor of the wrong dtype for ``banks.format``.
        ValueError: as :func:`submit`, plus bank tensors of the wrong rank, layout or device, or
            scale / zero-point shapes that do not match the codes (messages name the tensor,
            e.g. ``down_scales``).
    """
    if not isinstance(banks, ExpertBankView):
        raise TypeError(f"banks must be an ExpertBankView, got {type(banks).__name__}")
    return _ext.submit_banks(x, token_ids, expert_ids, weights, banks.format, banks.gate_up,
                             banks.down, isa=isa)


def cpu_moe_banks(
    x: torch.Tensor,
    token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    weights: torch.Tensor,
    banks: ExpertBankView,
    *,
    isa: str | None = None,
) -> torch.Tensor:
    """``submit_banks(...).wait()``: the blocking form; same arguments, result and errors."""
    return submit_banks(x, token_ids, expert_ids, weights, banks, isa=isa).wait()


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
