"""Dense copies of chosen MXFP4 experts (``freetoken.ops.cpu_moe.dequant``): the scalar and the
AVX2 copy (where this CPU has it) give the Python dequantiser's values exactly, in fp32 and bf16,
at odd shapes and at the extreme E8M0 scales; other formats go through their torch dequantisers."""

from __future__ import annotations

import pytest
import torch

from freetoken.ops.cpu_moe.cpu import supported_isas
from freetoken.ops.cpu_moe.dequant import dequantize_experts
from freetoken.ops.cpu_moe.formats import build_banks, dequantize_bank

VARIANTS = [isa for isa in ("scalar", "avx2") if isa in supported_isas()]
SHAPES = [(6, 64, 1024), (5, 37, 96), (3, 1, 32)]  # experts N, rows R, columns C


def _bank(n: int, rows: int, cols: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (n, rows, cols // 32, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(100, 150, (n, rows, cols // 32), generator=g, dtype=torch.uint8)
    extremes = torch.tensor([0, 1, 2, 127, 254, 255], dtype=torch.uint8)
    flat = scales.view(-1)
    flat[:min(6, flat.numel())] = extremes[-flat.numel():] if flat.numel() < 6 else extremes
    return blocks, scales


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal values, NaN where the other has NaN (0 x inf at scale 255); the AVX2 copy writes
    +0 for the negative-zero code, so zeros compare by value."""
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    return True


@pytest.mark.parametrize("isa", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "N{}-R{}-C{}".format(*s))
def test_copies_equal_the_python_dequantiser_bit_for_bit(isa, dtype, shape):
    bank = _bank(*shape, seed=sum(shape))
    ids = torch.tensor([shape[0] - 1, 0, shape[0] // 2, 0])  # any order, repeats allowed
    out = dequantize_experts("mxfp4", bank, ids, dtype, isa=isa)
    want = dequantize_bank("mxfp4", tuple(t[ids] for t in bank)).to(dtype)
    assert out.shape == (4, shape[1], shape[2]) and out.dtype == dtype
    assert _same(out, want)
    assert torch.isinf(out).any() and torch.isnan(out).any()  # the extremes were exercised
    into = torch.full_like(want, 7.0)
    assert dequantize_experts("mxfp4", bank, ids, dtype, isa=isa, out=into) is into
    assert _same(into, want)


def test_other_formats_use_their_dequantisers():
    g = torch.Generator().manual_seed(0)
    view = build_banks(torch.randn(4, 64, 64, generator=g), torch.randn(4, 64, 32, generator=g),
                       "q4g")
    ids = torch.tensor([3, 1])
    out = dequantize_experts("q4g", view.down, ids, torch.float32)
    assert torch.equal(out, dequantize_bank("q4g", tuple(t[ids] for t in view.down)))


def test_bad_arguments_are_clear_errors():
    bank = _bank(3, 4, 64, seed=1)
    with pytest.raises(ValueError, match=r"^ids\[1\] = 3 outside \[0, 3\)$"):
        dequantize_experts("mxfp4", bank, torch.tensor([0, 3]), torch.float32)
    with pytest.raises(ValueError, match=r"^out \[1, 4, 32\] must be \[n, R, C\] = \[1, 4, 64\]$"):
        dequantize_experts("mxfp4", bank, torch.tensor([0]), torch.float32,
                           out=torch.empty(1, 4, 32))
    with pytest.raises(ValueError, match="^dequantize_experts: out is torch.float32, expected "
                                         "torch.bfloat16$"):
        dequantize_experts("mxfp4", bank, torch.tensor([0]), torch.bfloat16,
                           out=torch.empty(1, 4, 64))
    with pytest.raises(ValueError, match="^dequantize_experts: dtype must be float32 or "
                                         "bfloat16, got torch.float16$"):
        dequantize_experts("mxfp4", bank, torch.tensor([0]), torch.float16)
    with pytest.raises(ValueError, match=r"^bank_scales \[3, 4, 1\] does not match"):
        dequantize_experts("mxfp4", (bank[0], bank[1][..., :1].contiguous()),
                           torch.tensor([0]), torch.float32)
