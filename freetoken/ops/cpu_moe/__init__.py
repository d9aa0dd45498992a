"""CPU SwiGLU expert MLP over host expert banks: C++ kernel (``cpu.py``) and torch reference.

``TOLERANCE`` bounds :func:`relative_rms_error` (``rms(out - ref) / rms(ref)``) of the kernel
against the fp32 reference, per weight dtype. For bf16 weights the reference reads the same bf16
values upcast exactly; the error comes from the AVX-512-BF16 variant rounding the activations
(``x`` and ``silu(g) * u``) to bf16 (relative 2^-9 per element) before ``vdpbf16ps``, and from fp32
summation order. Measured in tests/ops: below 1e-6 for avx2 and scalar. The avx512_bf16 bound
(expected a few 1e-3) has not yet been measured on a CPU with AVX-512-BF16.
"""

from __future__ import annotations

import torch

from freetoken.ops.cpu_moe.reference import cpu_moe_reference, relative_rms_error

TOLERANCE: dict[torch.dtype, float] = {torch.bfloat16: 1e-2}

__all__ = ["TOLERANCE", "cpu_moe_reference", "relative_rms_error"]
