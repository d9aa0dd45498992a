"""4-bit weight formats (freetoken/ops/cpu_moe/quant.py): exact layouts, rounding, round trips.

MXFP4 is checked against transformers' own gpt-oss dequantiser; q4g against hand-packed bytes.
"""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from freetoken.ops.cpu_moe import dequantize_mxfp4, dequantize_q4g, quantize_mxfp4, quantize_q4g
from freetoken.ops.cpu_moe.quant import FP4_MAGNITUDES

FP4 = torch.tensor(FP4_MAGNITUDES + tuple(-m for m in FP4_MAGNITUDES))


def _random_mxfp4(n, rows, cols, seed=0):
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (n, rows, cols // 32, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(100, 140, (n, rows, cols // 32), generator=g, dtype=torch.uint8)
    return blocks, scales


def test_mxfp4_dequant_matches_transformers_gpt_oss():
    blocks, scales = _random_mxfp4(3, 40, 96)
    ours = dequantize_mxfp4(blocks, scales)  # [N, R, C]
    theirs = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [N, C, R]
    assert ours.shape == (3, 40, 96)
    assert torch.equal(ours, theirs.transpose(1, 2))


def test_mxfp4_nibble_order_and_scale_bias():
    blocks = torch.zeros(1, 1, 1, 16, dtype=torch.uint8)
    blocks[0, 0, 0, 0] = 0x9F  # column 0: low nibble 0xF = -6; column 1: high nibble 0x9 = -0.5
    blocks[0, 0, 0, 15] = 0x70  # column 30: +0; column 31: 0x7 = +6
    w = dequantize_mxfp4(blocks, torch.tensor([[[129]]], dtype=torch.uint8))  # scale 2^2
    assert w[0, 0, :2].tolist() == [-24.0, -2.0]
    assert w[0, 0, 30:].tolist() == [0.0, 24.0]
    assert torch.equal(w[0, 0, 2:30], torch.zeros(28))
    # E8M0 0 is 2^-127 (subnormal in fp32), exactly.
    w0 = dequantize_mxfp4(blocks, torch.zeros(1, 1, 1, dtype=torch.uint8))
    assert w0[0, 0, 31].item() == 6.0 * 2.0**-127


def test_mxfp4_round_trip_exact_on_grid():
    blocks, scales = _random_mxfp4(2, 16, 64, seed=1)
    w = dequantize_mxfp4(blocks, scales)
    b2, s2 = quantize_mxfp4(w)
    assert b2.shape == blocks.shape and s2.shape == scales.shape
    assert b2.dtype == s2.dtype == torch.uint8
    assert torch.equal(dequantize_mxfp4(b2, s2), w)
    # Groups whose largest magnitude code is 6 keep their exact scale and codes (no -0 codes).
    blocks = blocks & 0x77 | 0x07  # every even column +6, no sign bits
    w = dequantize_mxfp4(blocks, scales)
    b3, s3 = quantize_mxfp4(w)
    assert torch.equal(s3, scales) and torch.equal(b3, blocks)


def test_mxfp4_rounds_to_nearest_with_ties_to_even():
    vals = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.75, -5.5, 0.1, -0.2]
    w = torch.tensor(vals + [0.0] * 20).reshape(1, 32)
    blocks, scales = quantize_mxfp4(w)
    assert scales.tolist() == [[127]]
    got = dequantize_mxfp4(blocks, scales)[0, : len(vals)].tolist()
    assert got == [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -1.0, -6.0, 0.0, 0.0]


def test_mxfp4_random_weights_pick_nearest_grid_value():
    w = torch.randn(4, 8, 64, generator=torch.Generator().manual_seed(2)) * 0.05
    blocks, scales = quantize_mxfp4(w)
    dq = dequantize_mxfp4(blocks, scales)
    scale = 2.0 ** (scales.double() - 127)  # [4, 8, 2]
    grid = FP4.double()[None, None, None, :] * scale[..., None]  # [4, 8, 2, 16]
    wd = w.double().reshape(4, 8, 2, 32, 1)
    best = (wd - grid[..., None, :]).abs().amin(-1)  # [4, 8, 2, 32]
    assert torch.equal((wd[..., 0] - dq.double().reshape(4, 8, 2, 32)).abs(), best)
    # The chosen exponent is the smallest that fits the group maximum: absmax / scale in (3, 6].
    amax = w.abs().reshape(4, 8, 2, 32).amax(-1).double()
    assert ((amax / scale > 3) & (amax / scale <= 6)).all()
    assert torch.equal(quantize_mxfp4(torch.zeros(1, 32))[1], torch.zeros(1, 1, dtype=torch.uint8))


def test_mxfp4_errors():
    with pytest.raises(ValueError) as exc:
        quantize_mxfp4(torch.zeros(4, 40))
    assert str(exc.value) == (
        "mxfp4: the input dimension (last, size 40) must be a multiple of the group size 32"
    )
    with pytest.raises(ValueError) as exc:
        quantize_mxfp4(torch.full((1, 32), float("inf")))
    assert str(exc.value) == "mxfp4: w must be finite"
    with pytest.raises(TypeError) as exc:
        quantize_mxfp4(torch.zeros(1, 32, dtype=torch.int32))
    assert str(exc.value) == "mxfp4: w must be a floating-point torch.Tensor"
    with pytest.raises(ValueError) as exc:
        dequantize_mxfp4(torch.zeros(1, 2, 8, dtype=torch.uint8),
                         torch.zeros(1, 2, dtype=torch.uint8))
    assert str(exc.value) == (
        "mxfp4 blocks [1, 2, 8] and scales [1, 2] must be [..., C/32, 16] and [..., C/32]"
    )


def test_q4g_nibble_order_and_formula():
    packed = torch.zeros(1, 16, dtype=torch.uint8)
    packed[0, 0] = 0x2F  # column 0: q = 15, column 1: q = 2
    scales = torch.tensor([[0.5]], dtype=torch.float16)
    sym = dequantize_q4g(packed, scales)
    assert sym[0, :2].tolist() == [(15 - 8) * 0.5, (2 - 8) * 0.5]
    assert sym[0, 2:].tolist() == [-4.0] * 30
    asym = dequantize_q4g(packed, scales, torch.tensor([[3]], dtype=torch.uint8))
    assert asym[0, :3].tolist() == [6.0, -0.5, -1.5]


@pytest.mark.parametrize("group,symmetric", [(32, True), (32, False), (64, True), (128, False)])
def test_q4g_round_trip_exact_on_grid(group, symmetric):
    g = torch.Generator().manual_seed(group)
    n, rows, cols = 2, 8, 256
    ng = cols // group
    scales = (torch.rand(n, rows, ng, generator=g) * 0.1 + 1e-3).half()
    q = torch.randint(1 if symmetric else 0, 16, (n, rows, ng, group), generator=g)
    q[..., 0] = 15
    q[..., 1] = 1 if symmetric else 0  # the group's extreme codes are present
    z = None if symmetric else torch.randint(0, 16, (n, rows, ng), generator=g, dtype=torch.uint8)
    w = ((q - (8 if z is None else z[..., None])) * scales.float()[..., None]).flatten(-2)
    packed, s2, z2 = quantize_q4g(w, group_size=group, symmetric=symmetric)
    assert packed.shape == (n, rows, cols // 2) and packed.dtype == torch.uint8
    assert s2.dtype == torch.float16 and torch.equal(s2, scales)
    assert (z2 is None) == symmetric
    if z is not None:
        assert torch.equal(z2, z)
    assert torch.equal(dequantize_q4g(packed, s2, z2), w)


@pytest.mark.parametrize("symmetric", [True, False])
def test_q4g_random_weights_pick_nearest_grid_value(symmetric):
    w = torch.randn(3, 4, 64, generator=torch.Generator().manual_seed(3)) * 0.02 + 0.01
    packed, scales, zeros = quantize_q4g(w, symmetric=symmetric)
    dq = dequantize_q4g(packed, scales, zeros).double()
    z = torch.full(scales.shape, 8.0) if zeros is None else zeros.double()
    grid = (torch.arange(16).double() - z[..., None]) * scales.double()[..., None]  # [3,4,2,16]
    wd = w.double().reshape(3, 4, 2, 32, 1)
    best = (wd - grid[..., None, :]).abs().amin(-1)
    err = (wd[..., 0] - dq.reshape(3, 4, 2, 32)).abs()
    assert torch.allclose(err, best, rtol=0, atol=1e-12)
    assert (err <= scales.double()[..., None] / 2 + 1e-12).all()  # within half a step


def test_q4g_errors():
    cases = [
        (dict(w=torch.zeros(2, 64), group_size=48), "q4g: group_size must be a positive multiple "
                                                      "of 32, got 48"),
        (dict(w=torch.zeros(2, 200)), "q4g: the input dimension (last, size 200) must be a "
                                      "multiple of the group size 32"),
        (dict(w=torch.zeros(2, 64), group_size=128), "q4g: the input dimension (last, size 64) "
                                                     "must be a multiple of the group size 128"),
        (dict(w=torch.full((1, 32), 1e6)), "q4g: a group scale overflows float16 (|w| too large)"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError) as exc:
            quantize_q4g(**kwargs)
        assert str(exc.value) == message
    with pytest.raises(ValueError) as exc:
        dequantize_q4g(torch.zeros(2, 24, dtype=torch.uint8), torch.zeros(2, 3).half())
    assert str(exc.value) == (
        "q4g packed [2, 24], scales [2, 3] and zeros None must be [..., C/2], [..., C/G] and "
        "[..., C/G] with G a multiple of 32"
    )
    with pytest.raises(TypeError) as exc:
        dequantize_q4g(torch.zeros(2, 16, dtype=torch.uint8), torch.zeros(2, 1))
    assert str(exc.value) == "q4g packed must be uint8 and scales float16, got torch.uint8 and " \
                             "torch.float32"
