"""Dense copies of chosen experts of a bank set, for batched matmuls over 4-bit resident experts.

:func:`dequantize_experts` gives experts ``ids`` of one bank as ``[n, R, C]`` in the compute
dtype; MXFP4 runs the C++ copy (``csrc/src/dequant.cpp``: exact, equal to
:func:`~freetoken.ops.cpu_moe.formats.dequantize_bank` on those rows, in fp32 and in bf16, since
every MXFP4 value is exact in both), the other formats their torch dequantisers.
"""

from __future__ import annotations

import torch

from freetoken.ops.cpu_moe import _ext
from freetoken.ops.cpu_moe.formats import dequantize_bank


def dequantize_experts(fmt: str, bank: tuple[torch.Tensor, ...], ids: torch.Tensor,
                       dtype: torch.dtype, *, block_size: tuple[int, int] | None = None,
                       isa: str | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Experts ``ids`` (``[n]`` int64, each in ``[0, N)``) of ``bank`` (the stored tensors of
    one ``[N, R, C]`` bank in ``fmt``, see :mod:`freetoken.ops.cpu_moe.formats`) as a new
    ``[n, R, C]`` tensor of ``dtype`` (float32 or bfloat16). ``isa`` picks the MXFP4 copy's
    variant (``scalar``; every other variant runs the AVX2 one; None: the best this CPU has);
    ``block_size`` is fp8's scale block; ``out``: a contiguous ``[n, R, C]`` tensor of
    ``dtype`` to write (and return) instead of a new one.

    Raises:
        ValueError: an id outside ``[0, N)``, bank tensors the kernel refuses (messages name
            the tensor, e.g. ``bank_scales``), or a ``dtype`` other than float32 / bfloat16.
    """
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"dequantize_experts: dtype must be float32 or bfloat16, got {dtype}")
    ids = ids.to(torch.int64).contiguous()
    if fmt != "mxfp4":
        dense = dequantize_bank(fmt, tuple(t.index_select(0, ids) for t in bank),
                                block_size=block_size).to(dtype)
        return dense if out is None else out.copy_(dense)
    if out is None:
        out = torch.empty(ids.numel(), bank[0].shape[1], bank[0].shape[2] * 32, dtype=dtype)
    elif out.dtype != dtype:
        raise ValueError(f"dequantize_experts: out is {out.dtype}, expected {dtype}")
    _ext.dequantize_experts(fmt, bank, ids, out, isa=isa)
    return out
