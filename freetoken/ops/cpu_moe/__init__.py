"""CPU SwiGLU expert MLP over host expert banks: C++ kernel (``cpu.py``), weight formats
(``formats.py``, ``quant.py``), the fp32 torch reference (``reference.py``) and the reference of
the int8-activation path (``reference_q8.py``).

Error bounds, all on :func:`relative_rms_error` (``rms(out - ref) / rms(ref)``) of the kernel
against the fp32 reference run on the *same* weight values (for 4-bit formats: the exactly
dequantised weights), so they measure the kernel's arithmetic, not the quantisation error:

* ``FP32_ACCUMULATION_TOLERANCE``: every format on the ``scalar`` and ``avx2`` variants (and on
  ``avx512_bf16`` for fp32/mxfp4/q4g, which run the AVX2 code). The only differences are fp32
  summation order and, for 4-bit formats, applying the group scale to the group's partial sum.
  Measured on this AVX2 machine: 2e-7 to 6e-7 (scalar up to 5.8e-7, avx2 up to 4.1e-7; bf16,
  fp32, mxfp4 and q4g alike).
* ``FORMAT_TOLERANCE[format]``: the bound for any variant. Only bf16 on ``avx512_bf16`` differs:
  it rounds the activations (``x`` and ``silu(g) * u``) to bf16 (relative 2^-9 per element)
  before ``vdpbf16ps``; expected a few 1e-3, not yet measured on a CPU with AVX-512-BF16.
* ``TOLERANCE[dtype]``: the same bounds keyed by the dense bank dtype (kept for callers of
  :func:`freetoken.ops.cpu_moe.cpu.submit`).

The int8-activation path (``activations="q8"``, mxfp4 / q4g banks; ``reference_q8.py``):

* ``Q8_ACCUMULATION_TOLERANCE``: the kernel (scalar and avx2) against
  :func:`cpu_moe_reference_q8`, the same int8 math in torch. Block sums are exact integers on
  both sides; what differs is the fp32 summation order (and so, rarely, an activation of
  ``silu(g) * u`` that lands on the other side of a rounding boundary when quantised). Measured on
  this AVX2 machine: 5e-8 to 3e-7.
* ``Q8_TOLERANCE``: the q8 path against the fp32 reference :func:`cpu_moe_reference_banks` on the
  same (dequantised) weights, i.e. the cost of quantising the activations. Measured on random
  Gaussian data (tests/ops/test_cpu_moe_q8.py shapes, H and I from 64 to 2048): 1.0e-2 to
  1.2e-2; bound 2e-2.
"""

from __future__ import annotations

import torch

from freetoken.ops.cpu_moe.formats import ExpertBankView, build_banks
from freetoken.ops.cpu_moe.quant import (
    dequantize_mxfp4,
    dequantize_q4g,
    quantize_mxfp4,
    quantize_q4g,
)
from freetoken.ops.cpu_moe.reference import (
    cpu_moe_reference,
    cpu_moe_reference_banks,
    relative_rms_error,
)
from freetoken.ops.cpu_moe.reference_q8 import cpu_moe_reference_q8, quantize_q8_blocks

FP32_ACCUMULATION_TOLERANCE = 1e-5
FORMAT_TOLERANCE: dict[str, float] = {"bf16": 1e-2, "fp32": 1e-5, "mxfp4": 1e-5, "q4g": 1e-5}
TOLERANCE: dict[torch.dtype, float] = {torch.bfloat16: 1e-2, torch.float32: 1e-5}
Q8_ACCUMULATION_TOLERANCE = 1e-5
Q8_TOLERANCE = 2e-2
ACTIVATIONS = ("fp32", "q8")

__all__ = [
    "ACTIVATIONS",
    "FORMAT_TOLERANCE",
    "FP32_ACCUMULATION_TOLERANCE",
    "Q8_ACCUMULATION_TOLERANCE",
    "Q8_TOLERANCE",
    "TOLERANCE",
    "ExpertBankView",
    "build_banks",
    "cpu_moe_reference",
    "cpu_moe_reference_banks",
    "cpu_moe_reference_q8",
    "dequantize_mxfp4",
    "dequantize_q4g",
    "quantize_mxfp4",
    "quantize_q4g",
    "quantize_q8_blocks",
    "relative_rms_error",
]
