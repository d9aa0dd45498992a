"""fp8 and nvfp4 weight formats (freetoken/ops/cpu_moe/quant.py): layouts, dequantisers against
direct formulas and the published ones, quantisers against the recipes they follow.

fp8 is checked against transformers' own FP8 dequantisers (``integrations/finegrained_fp8.py``)
and this repo's loader / tiny-checkpoint quantiser; nvfp4 against the formula and nibble order of
NVIDIA ModelOpt (``NVFP4QTensor``, nvfp4_tensor.py: codes packed ``(q[..., 1::2] << 4) |
q[..., 0::2]``, ``w = e2m1 * (e4m3(scale) * weight_scale_2)``) and vLLM's ``break_fp4_bytes`` /
``dequantize_to_dtype`` (low nibble first, the same product), restated here independently.
"""

from __future__ import annotations

import pytest
import torch

from freetoken.models.loader import dequantize_blocks
from freetoken.models.tiny_fp8 import quantize_blocks
from freetoken.ops.cpu_moe import (
    dequantize_fp8_blocks,
    dequantize_nvfp4,
    quantize_fp8_blocks,
    quantize_nvfp4,
)
from freetoken.ops.cpu_moe.formats import dequantize_bank

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _e4m3_exact(codes: torch.Tensor) -> torch.Tensor:
    """uint8 e4m3fn bytes -> float64 from the bit fields (NaN for S.1111.111)."""
    c = codes.long()
    sign = torch.where(c & 0x80 != 0, -1.0, 1.0).double()
    e, m = (c >> 3) & 0xF, (c & 0x7).double()
    val = torch.where(e == 0, m / 8 * 2.0**-6, (1 + m / 8) * torch.pow(2.0, (e - 7).double()))
    val = torch.where((c & 0x7F) == 0x7F, torch.full_like(val, float("nan")), val)
    return sign * val


def _random_fp8(n, rows, cols, block, seed=0, nan=True):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (n, rows, cols), generator=g, dtype=torch.uint8)
    if not nan:
        codes[(codes & 0x7F) == 0x7F] = 0x38
    grid = (n, -(-rows // block[0]), -(-cols // block[1]))
    scales = torch.rand(grid, generator=g) * 2.0 ** torch.randint(-20, 4, grid, generator=g)
    return codes.view(torch.float8_e4m3fn), scales


def test_fp8_dequant_matches_direct_formula_ragged_blocks():
    values, scales = _random_fp8(3, 40, 72, (16, 32))  # grids 3 x 3, last blocks partial
    assert torch.unique(values.view(torch.uint8)).numel() == 256
    r = torch.arange(40)[:, None] // 16
    c = torch.arange(72)[None, :] // 32
    want = (_e4m3_exact(values.view(torch.uint8)) * scales.double()[:, r, c]).float()
    got = dequantize_fp8_blocks(values, scales, (16, 32))
    assert got.dtype == torch.float32 and got.shape == (3, 40, 72)
    nan = (values.view(torch.uint8) & 0x7F) == 0x7F
    assert torch.equal(torch.isnan(got), nan) and torch.equal(torch.isnan(want), nan)
    assert torch.equal(got[~nan], want[~nan])


def test_fp8_dequant_matches_transformers_and_loader():
    ftp = pytest.importorskip("transformers.integrations.finegrained_fp8")
    values, scales = _random_fp8(2, 200, 72, (128, 128), seed=1, nan=False)  # ragged
    ours = dequantize_fp8_blocks(values, scales, (128, 128))
    theirs = ftp._dequantize_fp8_weight(values, scales, [128, 128], torch.float32)
    assert torch.equal(ours, theirs)
    values, scales = _random_fp8(2, 256, 384, (128, 128), seed=2, nan=False)  # divisible
    ours = dequantize_fp8_blocks(values, scales, (128, 128))
    op = ftp.Fp8Dequantize(hf_quantizer=None)
    assert torch.equal(ours, op._dequantize_one(values, scales, output_dtype=torch.float32))
    for e in range(2):
        assert torch.equal(ours[e], dequantize_blocks(values[e], scales[e]))
    assert torch.equal(dequantize_bank("fp8", (values, scales), block_size=(128, 128)), ours)


def test_fp8_quantize_matches_tiny_checkpoints():
    w = torch.randn(2, 256, 128, generator=torch.Generator().manual_seed(3)) * 0.05
    values, scales = quantize_fp8_blocks(w, (128, 64))
    tv, ts = quantize_blocks(w, (128, 64))
    assert values.dtype == torch.float8_e4m3fn and scales.dtype == torch.float32
    assert torch.equal(values.view(torch.uint8), tv.view(torch.uint8))
    assert torch.equal(scales, ts)


def test_fp8_quantize_ragged_blocks_nearest_value():
    w = torch.randn(3, 40, 72, generator=torch.Generator().manual_seed(4))
    w[0, 32:, 64:] = 0.0  # an all-zero (partial) block: scale 1, values 0
    values, scales = quantize_fp8_blocks(w, (16, 32))
    assert values.shape == (3, 40, 72) and scales.shape == (3, 3, 3)
    for bi in range(3):
        for bj in range(3):
            blk = w[:, 16 * bi:16 * bi + 16, 32 * bj:32 * bj + 32]
            amax = blk.abs().amax(dim=(-2, -1))
            want = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
            assert torch.equal(scales[:, bi, bj], want)
    assert scales[0, 2, 2] == 1.0 and (values[0, 32:, 64:].float() == 0).all()
    grid = _e4m3_exact(torch.arange(256, dtype=torch.uint8))
    grid = grid[torch.isfinite(grid)]
    r, c = torch.arange(40)[:, None] // 16, torch.arange(72)[None, :] // 32
    v = w.double() / scales.double()[:, r, c]  # the value each code approximates
    chosen = _e4m3_exact(values.view(torch.uint8))
    best = (v[..., None] - grid).abs().amin(-1)
    assert torch.allclose((v - chosen).abs(), best, rtol=1e-6, atol=0)
    deq = dequantize_fp8_blocks(values, scales, (16, 32))
    assert ((deq - w).norm() / w.norm()).item() < 0.05  # e4m3: 3 mantissa bits


def _vllm_modelopt_dequant(packed: torch.Tensor, scales: torch.Tensor,
                           weight_scale_2: float) -> torch.Tensor:
    """One matrix ``[R, C/2]`` by the published NVFP4 formula: codes low nibble first
    (even column), value ``sign * E2M1[code & 7]``, times ``fp32(fp32(scale) * weight_scale_2)``
    per 16 columns."""
    codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1).flatten(-2).long()  # [R, C]
    mag = torch.tensor(E2M1)[codes & 7]
    vals = torch.where(codes & 8 != 0, -mag, mag)
    block = scales.float() * torch.tensor(weight_scale_2, dtype=torch.float32)  # [R, C/16]
    return (vals.reshape(*block.shape, 16) * block[..., None]).flatten(-2)


def _random_nvfp4(n, rows, cols, seed=0):
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (n, rows, cols // 2), generator=g, dtype=torch.uint8)
    scales = torch.randint(0, 256, (n, rows, cols // 16), generator=g, dtype=torch.uint8)
    scales[(scales & 0x7F) == 0x7F] = 0x38
    glob = torch.rand(n, generator=g) * 1e-2 + 1e-4
    return packed, scales.view(torch.float8_e4m3fn), glob


def test_nvfp4_nibble_order_and_scales():
    packed = torch.zeros(1, 1, 8, dtype=torch.uint8)
    packed[0, 0, 0] = 0x9F  # column 0: low nibble 0xF = -6; column 1: high nibble 0x9 = -0.5
    packed[0, 0, 7] = 0x70  # column 14: +0; column 15: 0x7 = +6
    scales = torch.tensor([[[0x40]]], dtype=torch.uint8).view(torch.float8_e4m3fn)  # 2.0
    w = dequantize_nvfp4(packed, scales, torch.tensor([[0.25]]))  # block scale 0.5
    assert w[0, 0, :2].tolist() == [-3.0, -0.25]
    assert w[0, 0, 14:].tolist() == [0.0, 3.0] and (w[0, 0, 2:14] == 0).all()


def test_nvfp4_dequant_matches_published_formula():
    packed, scales, glob = _random_nvfp4(3, 40, 96)
    rows_global = glob[:, None].expand(3, 40).contiguous()
    ours = dequantize_nvfp4(packed, scales, rows_global)
    assert ours.dtype == torch.float32 and ours.shape == (3, 40, 96)
    for e in range(3):
        assert torch.equal(ours[e], _vllm_modelopt_dequant(packed[e], scales[e], glob[e].item()))
    # A fused gate_up: rows [0:20] with one weight_scale_2, rows [20:40] with another.
    two = torch.cat([glob[:1, None].expand(1, 20), glob[1:2, None].expand(1, 20)], dim=1)
    fused = dequantize_nvfp4(packed[:1], scales[:1], two.contiguous())[0]
    assert torch.equal(fused[:20], _vllm_modelopt_dequant(packed[0, :20], scales[0, :20],
                                                          glob[0].item()))
    assert torch.equal(fused[20:], _vllm_modelopt_dequant(packed[0, 20:], scales[0, 20:],
                                                          glob[1].item()))
    assert torch.equal(dequantize_bank("nvfp4", (packed, scales, rows_global)), ours)


def test_nvfp4_dequant_within_a_rounding_of_the_exact_product():
    """``e2m1 * e4m3`` is exact in fp32 (what the kernel multiplies); the dequantised weight is
    the exact ``e2m1 * e4m3 * global`` within two roundings."""
    packed, scales, glob = _random_nvfp4(2, 24, 64, seed=1)
    codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1).flatten(-2).long()
    mag = torch.tensor(E2M1, dtype=torch.float64)[codes & 7]
    vals = torch.where(codes & 8 != 0, -mag, mag).reshape(2, 24, 4, 16)
    s64 = _e4m3_exact(scales.view(torch.uint8)).reshape(2, 24, 4, 1)
    product = vals * s64
    assert torch.equal(product.float().double(), product)  # exact in fp32
    exact = (product * glob.double()[:, None, None, None]).flatten(-2)
    ours = dequantize_nvfp4(packed, scales, glob[:, None].expand(2, 24).contiguous()).double()
    assert ((ours - exact).abs() <= 2.0**-23 * exact.abs()).all()


def _nearest_e2m1_code(v: torch.Tensor) -> torch.Tensor:
    """Nearest e2m1 code of each fp32 ``v``: ties to the even magnitude index, saturating at 6,
    the sign bit set for every negative ``v`` (ModelOpt's rounding, restated by distance)."""
    grid = torch.tensor(E2M1, dtype=torch.float64)
    d = (v.double().abs()[..., None] - grid).abs()
    best = d == d.amin(-1, keepdim=True)
    prefer = best.long() * torch.tensor([2, 1, 2, 1, 2, 1, 2, 1])  # even index wins a tie
    return prefer.argmax(-1) | torch.where(v < 0, 8, 0)


def test_nvfp4_quantize_follows_modelopt_recipe():
    w = torch.randn(2, 32, 64, generator=torch.Generator().manual_seed(5)) * 0.02
    w[1, 3, 16:32] = 0.0  # an all-zero group: scale 1.0, codes 0
    packed, scales, glob = quantize_nvfp4(w)
    assert packed.dtype == torch.uint8 and packed.shape == (2, 32, 32)
    assert scales.dtype == torch.float8_e4m3fn and scales.shape == (2, 32, 4)
    assert glob.dtype == torch.float32 and glob.shape == (2, 32)
    for e in range(2):
        g = w[e].abs().amax() / (6.0 * 448.0)
        assert (glob[e] == g).all()
        ratio = w[e].reshape(32, 4, 16).abs().amax(-1) / (6.0 * g)
        ratio = torch.where(ratio == 0, torch.ones_like(ratio), ratio)
        want_scales = ratio.clamp(min=2.0**-9, max=448.0).to(torch.float8_e4m3fn)
        assert torch.equal(scales[e].view(torch.uint8), want_scales.view(torch.uint8))
        v = w[e].reshape(32, 4, 16) / (want_scales.float() * g)[..., None]
        codes = _nearest_e2m1_code(v).flatten(-2)
        assert torch.equal(packed[e], (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8))
    assert scales[1, 3, 1].float() == 1.0 and (packed[1, 3, 8:16] == 0).all()
    deq = dequantize_nvfp4(packed, scales, glob)
    assert ((deq - w).norm() / w.norm()).item() < 0.15  # 4-bit codes


def test_nvfp4_quantize_ties_saturation_and_negative_zero():
    # amax 10.5 gives weight_scale_2 = 10.5 / 2688 = 2^-8 and block scale 448 (both exact), so
    # each code approximates w / 1.75 exactly: the midpoints are ties.
    mids = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    row = [6.0] + mids + [-0.75, -0.1, 0.1, -6.0, 2.9, -5.4, 0.0, 6.0]
    w = torch.tensor(row, dtype=torch.float32)[None, :] * 1.75
    packed, scales, glob = quantize_nvfp4(w)
    assert glob.item() == 2.0**-8 and scales.float().item() == 448.0
    codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1).flatten(-2)[0].tolist()
    assert codes == [7, 0, 2, 2, 4, 4, 6, 6, 10, 8, 0, 15, 5, 15, 0, 7]
    assert dequantize_nvfp4(packed, scales, glob)[0].tolist()[:8] == [
        10.5, 0.0, 1.75, 1.75, 3.5, 3.5, 7.0, 7.0]


@pytest.mark.parametrize("call,exc_type,message", [
    (lambda: quantize_nvfp4(torch.zeros(4, 24)), ValueError,
     "nvfp4: the input dimension (last, size 24) must be a multiple of the group size 16"),
    (lambda: quantize_fp8_blocks(torch.zeros(4, 24), (128,)), ValueError,
     "fp8: block_size must be two positive integers (bm, bn), got (128,)"),
    (lambda: dequantize_fp8_blocks(*_random_fp8(1, 8, 8, (4, 4)), (8, 4)), ValueError,
     "fp8 scales [1, 2, 2] do not match values [1, 8, 8] with block_size (8, 4): expected "
     "[1, 1, 2]"),
    (lambda: dequantize_fp8_blocks(torch.zeros(1, 8, 8), torch.ones(1, 1, 1), (8, 8)),
     TypeError, "fp8 values must be float8_e4m3fn and scales float32, got torch.float32 and "
                "torch.float32"),
    (lambda: dequantize_bank("fp8", _random_fp8(1, 8, 8, (4, 4))), ValueError,
     "dequantize_bank: fp8 banks need block_size (bm, bn)"),
    (lambda: dequantize_nvfp4(*_random_nvfp4(1, 4, 32)[:2], torch.ones(1, 5)), ValueError,
     "nvfp4 packed [1, 4, 16], scales [1, 4, 2] and global [1, 5] must be [..., R, C/2], "
     "[..., R, C/16] and [..., R]"),
    (lambda: dequantize_nvfp4(_random_nvfp4(1, 4, 32)[0], torch.ones(1, 4, 2),
                              torch.ones(1, 4)), TypeError,
     "nvfp4 packed, scales and global must be uint8, float8_e4m3fn and float32, got "
     "torch.uint8, torch.float32 and torch.float32"),
])
def test_errors(call, exc_type, message):
    with pytest.raises(exc_type) as exc:
        call()
    assert str(exc.value) == message
