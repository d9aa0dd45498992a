"""The C++ dense linear at decode sizes (``freetoken.ops.linear``) against its fp32 reference, on
every ISA variant this CPU supports, and the model-side dispatch :func:`linear`."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from freetoken.ops.cpu_moe import relative_rms_error
from freetoken.ops.cpu_moe.cpu import kernels, supported_isas
from freetoken.ops.linear import KERNEL_MAX_ROWS, LINEAR_TOLERANCE, kernel_linear, linear
from freetoken.ops.linear.reference import linear_reference

ISAS = supported_isas()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("t,c,r", [(1, 1024, 1536), (3, 1024, 8256), (1, 33, 7), (8, 1000, 1030),
                                   (2, 48, 5), (5, 64, 96)])
def test_matches_reference(isa, dtype, t, c, r):
    g = torch.Generator().manual_seed(t * c + r)
    w = (torch.randn(r, c, generator=g) / c**0.5).to(dtype)
    x = torch.randn(t, c, generator=g)
    out = kernel_linear(x, w, isa=isa)
    assert out.shape == (t, r) and out.dtype == torch.float32
    assert relative_rms_error(linear_reference(x, w), out) <= LINEAR_TOLERANCE
    # bf16 x is widened exactly: the same as feeding its fp32 values
    xb = x.bfloat16()
    assert torch.equal(kernel_linear(xb, w, isa=isa), kernel_linear(xb.float(), w, isa=isa))


def test_dispatch_runs_the_kernel_for_decode_rows_and_torch_for_prefill():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 64, generator=g).bfloat16()
    x = torch.randn(KERNEL_MAX_ROWS + 1, 64, generator=g).bfloat16()
    calls = {n: c for n, _, c in kernels()}
    small = linear(x[:2], w)
    after = {n: c for n, _, c in kernels()}
    assert sum(after.values()) == sum(calls.values()) + 1
    assert small.dtype == torch.bfloat16 and small.shape == (2, 96)
    assert torch.equal(small, kernel_linear(x[:2], w).bfloat16())
    after = {n: c for n, _, c in kernels()}
    big = linear(x, w)  # more rows than KERNEL_MAX_ROWS: torch
    assert torch.equal(big, F.linear(x, w))
    assert {n: c for n, _, c in kernels()} == after
    # the kernel's result is the fp32 reference rounded to bf16, up to summation order
    assert relative_rms_error(F.linear(x[:2].float(), w.float()), small.float()) < 4e-3
    xf, wf = x.float(), w.float()
    assert relative_rms_error(F.linear(xf[:3], wf), linear(xf[:3], wf)) <= LINEAR_TOLERANCE


def test_bad_arguments_are_clear_errors():
    w = torch.randn(8, 16)
    with pytest.raises(ValueError, match=r"^x \[2, 15\] and w \[8, 16\] disagree on C"):
        kernel_linear(torch.randn(2, 15), w)
    with pytest.raises(TypeError, match="w must be a torch.Tensor"):
        kernel_linear(torch.randn(2, 16), "w")
    with pytest.raises(ValueError, match="unknown CPU MoE ISA 'sse9'"):
        kernel_linear(torch.randn(2, 16), w, isa="sse9")
    assert torch.equal(kernel_linear(torch.randn(0, 16), w), torch.zeros(0, 8))
