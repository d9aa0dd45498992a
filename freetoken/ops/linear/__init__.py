"""Dense linear layers at decode sizes through the C++ CPU kernel (``csrc/src/linear.cpp``).

:func:`linear` is ``F.linear(x, w)`` (no bias) for the model's dense projections (attention q/k/v
and o, Gated DeltaNet in/out, router, shared expert, lm_head). On the CPU with at most
:data:`KERNEL_MAX_ROWS` rows of ``x`` it runs the project's ``rows_dot`` kernels on the kernel
pool, which stream a bf16 weight at close to the memory bandwidth (one token, a 256 MB weight, 2
threads on the 2-core dev machine: 27-30 GB/s, against 38 GB/s for a plain read and 9 GB/s for
torch's bf16 GEMV); larger inputs (prefill,
compute bound) and other devices keep ``F.linear``. Products are exact and summed in fp32, so the
result equals :func:`freetoken.ops.linear.reference.linear_reference` within
:data:`LINEAR_TOLERANCE` (fp32 summation order), and a bf16 result is that value rounded to
bf16, as ``F.linear`` rounds its fp32 accumulator.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from freetoken.ops.cpu_moe import _ext

KERNEL_MAX_ROWS = 8
LINEAR_TOLERANCE = 1e-5  # relative RMS against the fp32 reference, fp32 inputs
_KERNEL_DTYPES = (torch.float32, torch.bfloat16)


def kernel_linear(x: torch.Tensor, w: torch.Tensor, *, isa: str | None = None) -> torch.Tensor:
    """``x [T, C] @ w [R, C]^T`` on the C++ kernel: ``[T, R]`` fp32.

    Args:
        x: ``[T, C]`` fp32 or bf16, contiguous, CPU.
        w: ``[R, C]`` fp32 or bf16, contiguous, CPU.
        isa: kernel ISA variant (``freetoken.ops.cpu_moe.cpu.supported_isas``); None reads
            ``FREETOKEN_CPU_MOE_ISA``, else the best one.

    Raises:
        TypeError: a non-tensor or a wrong dtype. ValueError: wrong device, rank, layout, C
            mismatch, or an unsupported ``isa``.
    """
    return _ext.linear(x, w, isa=isa)


def cpu_kernel_fits(x: torch.Tensor, *weights: torch.Tensor,
                    max_rows: int = KERNEL_MAX_ROWS) -> bool:
    """Whether the C++ kernels take this decode-size work: ``x [T, ...]`` with
    ``T <= max_rows`` (default ``KERNEL_MAX_ROWS``) and contiguous ``weights``, all on the CPU
    and all fp32 or all bf16 (the rule :func:`linear` and the resident-expert path
    ``grouped_swiglu`` share)."""
    return (x.device.type == "cpu" and x.shape[0] <= max_rows
            and x.dtype in _KERNEL_DTYPES
            and all(w.device.type == "cpu" and w.dtype == x.dtype and w.is_contiguous()
                    for w in weights))


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, w)`` (``x [T, C]``, ``w [R, C]``, the same dtype; result ``[T, R]`` in that
    dtype), on the C++ kernel for small T on the CPU (module doc), else ``F.linear``."""
    if x.dim() == 2 and w.dim() == 2 and cpu_kernel_fits(x, w):
        out = _ext.linear(x.contiguous(), w)
        return out if x.dtype == torch.float32 else out.to(x.dtype)
    return F.linear(x, w)
