"""CPU SwiGLU expert MLP over host expert banks: C++ kernel (``cpu.py``), weight formats
(``formats.py``, ``quant.py``: bf16, fp32, mxfp4, q4g, and the released checkpoints' fp8 blocks
and NVIDIA NVFP4), the fp32 torch reference (``reference.py``, also of the
bf16-activation path), the reference of the int8-activation path (``reference_q8.py``) and the
comparison of the rounded paths up to rounding ambiguity (``rounding.py``).

Error bounds, all on :func:`relative_rms_error` (``rms(out - ref) / rms(ref)``) of the kernel
against the fp32 reference run on the *same* weight values (for 4-bit formats: the exactly
dequantised weights), so they measure the kernel's arithmetic, not the quantisation error:

* ``FP32_ACCUMULATION_TOLERANCE``: every format on every ISA variant with the default fp32
  activations (``scalar``, ``avx2``, ``avx512`` and ``avx512_bf16``, which runs the ``avx512``
  code for them). The only differences are fp32 summation order and, for 4-bit formats, applying
  the group scale to the group's partial sum. Measured: 2e-7 to 6e-7 on AVX2 and AVX-512 CPUs.
  fp8 and nvfp4 with fp32 activations keep it: fp8 decodes e4m3 exactly and scales each
  block's partial sum (its many-vector schedule multiplies ``fl(e4m3 * scale)``, the
  reference's weights); nvfp4 multiplies the exact ``e2m1 * e4m3`` and applies the global scale
  to each row's sum, against reference weights ``fl(e2m1 * fl(e4m3 * global))`` (ModelOpt's /
  vLLM's dequantiser). Measured (tests/ops/test_cpu_moe_{fp8,nvfp4}.py shapes and H = 2048,
  I = 768; gpt-oss options included; every variant): 9e-8 to 8e-7.

The bf16-activation path (``activations="bf16"``, bf16 banks opt-in; fp8 banks, the default
in a bf16 model; fp8 on ``avx512_bf16`` with AVX512_VBMI decodes e4m3 to bf16 by table lookup
for ``vdpbf16ps``, 2x the fp32-activation kernel's rate):

* ``BF16_ACCUMULATION_TOLERANCE``: the kernel against ``cpu_moe_reference(...,
  activations="bf16")``, which rounds ``x`` and ``silu(g) * u`` to bf16 the same way; bf16 x bf16
  products are exact in fp32, so only summation order (and ``vdpbf16ps`` flushing denormals)
  differs, plus, rarely, an element of ``silu(g) * u`` whose fp32 value lies on the other side of
  a bf16 rounding boundary, which the comparison removes (``rounding.py``). Measured up to
  rounding: 0 to 4e-7.
* ``BF16_TOLERANCE``: the bf16-activation path against the fp32 reference on the same weights:
  the cost of rounding the activations (relative 2^-9 per element). Measured on random Gaussian
  data: 2.3e-3 to 3.1e-3; bound 1e-2. On the tiny models' logits: 3e-5 to 4e-5.

The int8-activation path (``activations="q8"``, mxfp4 / q4g banks; ``reference_q8.py``):

* ``Q8_ACCUMULATION_TOLERANCE``: the kernel (scalar and avx2) against
  :func:`cpu_moe_reference_q8`, the same int8 math in torch, up to rounding ambiguity. Block sums
  are exact integers on both sides; what differs is the fp32 summation order, and so, now and
  then, an activation of ``silu(g) * u`` that lands on the other side of a rounding boundary when
  quantised (one such element: 3e-4 to 6e-4 at H = 2048, I = 768), which the comparison removes
  (``rounding.py``). Measured up to rounding: 5e-8 to 3e-7.
* ``Q8_TOLERANCE``: the q8 path against the fp32 reference :func:`cpu_moe_reference_banks` on the
  same (dequantised) weights, i.e. the cost of quantising the activations. Measured on random
  Gaussian data (tests/ops/test_cpu_moe_q8.py shapes, H and I from 64 to 2048): 1.0e-2 to
  1.2e-2; bound 2e-2.

The gpt-oss options (``gate_up_bias``, ``down_bias``, ``swiglu_limit``, ``swiglu_alpha``; see
:mod:`freetoken.ops.cpu_moe.cpu`) keep every bound above, the references taking the same
keywords (:func:`expert_activation` is the activation). Measured with the clamps active
(tests/ops/test_cpu_moe_gptoss.py): fp32 1.5e-7 to 3.9e-7; bf16 up to rounding 0 to 2.1e-7 and
2.1e-3 to 3.3e-3 against fp32; q8 up to rounding 0 to 9.4e-8 and 7.9e-3 to 1.3e-2 against fp32.
"""

from __future__ import annotations

from freetoken.ops.cpu_moe.formats import ExpertBankView, build_banks
from freetoken.ops.cpu_moe.quant import (
    dequantize_fp8_blocks,
    dequantize_mxfp4,
    dequantize_nvfp4,
    dequantize_q4g,
    quantize_fp8_blocks,
    quantize_mxfp4,
    quantize_nvfp4,
    quantize_q4g,
)
from freetoken.ops.cpu_moe.reference import (
    cpu_moe_reference,
    cpu_moe_reference_banks,
    expert_activation,
    relative_rms_error,
)
from freetoken.ops.cpu_moe.reference_q8 import cpu_moe_reference_q8, quantize_q8_blocks

FP32_ACCUMULATION_TOLERANCE = 1e-5
BF16_ACCUMULATION_TOLERANCE = 1e-5
BF16_TOLERANCE = 1e-2
Q8_ACCUMULATION_TOLERANCE = 1e-5
Q8_TOLERANCE = 2e-2
ACTIVATIONS = ("fp32", "q8", "bf16")

__all__ = [
    "ACTIVATIONS",
    "BF16_ACCUMULATION_TOLERANCE",
    "BF16_TOLERANCE",
    "FP32_ACCUMULATION_TOLERANCE",
    "Q8_ACCUMULATION_TOLERANCE",
    "Q8_TOLERANCE",
    "ExpertBankView",
    "build_banks",
    "cpu_moe_reference",
    "cpu_moe_reference_banks",
    "cpu_moe_reference_q8",
    "dequantize_fp8_blocks",
    "dequantize_mxfp4",
    "dequantize_nvfp4",
    "dequantize_q4g",
    "expert_activation",
    "quantize_fp8_blocks",
    "quantize_mxfp4",
    "quantize_nvfp4",
    "quantize_q4g",
    "quantize_q8_blocks",
    "relative_rms_error",
]
