"""The C++ kernel's int8-activation path (``activations="q8"``) against its torch reference.

Bounds (relative RMS, :func:`relative_rms_error`): the kernel against
:func:`cpu_moe_reference_q8` (the same integer math) within ``Q8_ACCUMULATION_TOLERANCE`` = 1e-5
up to rounding ambiguity (``rounding.q8_accumulation_error``; measured 5e-8 to 3e-7: block sums
are exact integers on both sides, only the fp32 summation order differs); against the fp32 reference on the same dequantised weights within
``Q8_TOLERANCE`` = 2e-2 (measured 1.0e-2 to 1.2e-2: the cost of int8 activations).
Shape letters: T tokens, H hidden, I expert intermediate, N flat expert ids, K top-k.
"""

from __future__ import annotations

import functools

import pytest
import torch

from freetoken.ops.cpu_moe import (
    Q8_ACCUMULATION_TOLERANCE,
    Q8_TOLERANCE,
    ExpertBankView,
    build_banks,
    cpu_moe_reference_banks,
    cpu_moe_reference_q8,
    quantize_q8_blocks,
    relative_rms_error,
)
from freetoken.ops.cpu_moe.cpu import cpu_moe, cpu_moe_banks, quantize_q8, supported_isas
from freetoken.ops.cpu_moe.rounding import q8_accumulation_error

ISAS = supported_isas()
# (format, build_banks kwargs): q4g symmetric (z = 8), with zero points, groups of 64 and 96.
VARIANTS = [
    ("mxfp4", {}),
    ("q4g", {}),
    ("q4g", dict(symmetric=False)),
    ("q4g", dict(group_size=64, symmetric=False)),
]
VARIANT_IDS = ["mxfp4", "q4g-sym", "q4g-zeros", "q4g-zeros-g64"]


def _banks(fmt, kwargs, n, h, i, seed=0) -> ExpertBankView:
    return _cached_banks(fmt, tuple(sorted(kwargs.items())), n, h, i, seed)


@functools.cache
def _cached_banks(fmt, kwargs, n, h, i, seed) -> ExpertBankView:
    """Built once per session for the ISA variants that share them (4-bit quantising is slow)."""
    kwargs = dict(kwargs)
    g = torch.Generator().manual_seed(seed)
    gate_up = torch.randn(n, 2 * i, h, generator=g) / h**0.5  # [N, 2I, H]
    down = torch.randn(n, h, i, generator=g) / i**0.5  # [N, H, I]
    return build_banks(gate_up, down, fmt, **kwargs)


def _topk_triples(t: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(t)])  # [T, K]
    w = torch.rand(t, k, generator=g).softmax(-1)  # [T, K]
    return torch.arange(t).repeat_interleave(k), ids.flatten(), w.flatten()


def _check(x, tok, ids, w, banks, isa) -> torch.Tensor:
    """Kernel q8 output vs the q8 reference (tight) and the fp32 reference (Q8_TOLERANCE)."""
    out = cpu_moe_banks(x, tok, ids, w, banks, isa=isa, activations="q8")
    assert out.shape == (x.shape[0], banks.hidden) and out.dtype == torch.float32
    err = q8_accumulation_error(out, x, tok, ids, w, banks)
    assert err <= Q8_ACCUMULATION_TOLERANCE, f"{banks.format} {isa}: vs q8 reference {err:.3g}"
    dense = relative_rms_error(cpu_moe_reference_banks(x, tok, ids, w, banks), out)
    assert 1e-3 < dense <= Q8_TOLERANCE, f"{banks.format} {isa}: vs fp32 reference {dense:.3g}"
    return out


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt,kwargs", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize(
    "t,h,i,n,k",
    [
        pytest.param(1, 256, 128, 8, 4, id="decode-T1"),
        pytest.param(1, 2048, 768, 4, 4, id="decode-T1-H2048"),
        pytest.param(16, 192, 320, 8, 3, id="prefill-T16-oddK"),
        pytest.param(128, 64, 128, 4, 2, id="prefill-T128"),
        pytest.param(5, 192, 64, 6, 3, id="odd-T5-H192"),
    ],
)
def test_matches_q8_reference(isa, fmt, kwargs, t, h, i, n, k):
    banks = _banks(fmt, kwargs, n, h, i)
    x = torch.randn(t, h, generator=torch.Generator().manual_seed(t + h))
    _check(x, *_topk_triples(t, n, k, seed=t), banks, isa)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt,kwargs", [("mxfp4", {}), ("q4g", dict(symmetric=False)),
                                        ("q4g", dict(group_size=96, symmetric=False))],
                         ids=["mxfp4", "q4g-zeros", "q4g-zeros-g96"])
def test_block_counts_that_leave_partial_chunks(isa, fmt, kwargs):
    """H = 96 (3 blocks: a pair and an unpaired block) and I = 160 / 288 (5 / 9 blocks): the
    AVX2 code's partial 8-block chunks and its unpaired last block; odd T and odd top-k."""
    i = 288 if kwargs.get("group_size") == 96 else 160
    banks = _banks(fmt, kwargs, 7, 96, i, seed=3)
    x = torch.randn(13, 96, generator=torch.Generator().manual_seed(5))
    _check(x, *_topk_triples(13, 7, 3, seed=2), banks, isa)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", ["mxfp4", "q4g"])
def test_hostile_routings(isa, fmt):
    """All 128 tokens on one expert, idle experts, -1 ids mixed in, repeated experts per token,
    and an all-skipped routing (zeros)."""
    n, h, i = 8, 160, 96
    banks = _banks(fmt, {} if fmt == "mxfp4" else dict(symmetric=False), n, h, i, seed=1)
    g = torch.Generator().manual_seed(9)
    x = torch.randn(128, h, generator=g)
    one = (torch.arange(128), torch.full((128,), 5), torch.rand(128, generator=g))
    _check(x, *one, banks, isa)
    tok = torch.arange(31).repeat_interleave(3)  # odd T, three triples each
    ids = torch.randint(0, 3, (93,), generator=g)  # experts 3..7 idle, repeats within a token
    ids[::4] = -1
    _check(x[:31].contiguous(), tok, ids, torch.rand(93, generator=g), banks, isa)
    skipped = cpu_moe_banks(x[:4].contiguous(), torch.arange(4), torch.full((4,), -1),
                            torch.ones(4), banks, isa=isa, activations="q8")
    assert torch.equal(skipped, torch.zeros(4, h))


@pytest.mark.parametrize("isa", ISAS)
def test_any_uint8_zero_point_and_extreme_scales_stay_exact(isa):
    """q4g zero points up to 255 (weights c - z down to -255) and E8M0 scale bytes 0, 1 (subnormal
    weight scales) and 1..254: integer block sums stay exact, so the q8 reference still holds."""
    g = torch.Generator().manual_seed(4)
    n, h, i = 4, 128, 96

    def q4g_bank(rows, cols):
        return (torch.randint(0, 256, (n, rows, cols // 2), generator=g, dtype=torch.uint8),
                (torch.rand(n, rows, cols // 32, generator=g) * 1e-3).half(),
                torch.randint(0, 256, (n, rows, cols // 32), generator=g, dtype=torch.uint8))

    def mx_bank(rows, cols):
        scales = torch.randint(110, 130, (n, rows, cols // 32), generator=g, dtype=torch.uint8)
        scales[:, ::7] = torch.randint(0, 2, scales[:, ::7].shape, generator=g).to(torch.uint8)
        return (torch.randint(0, 256, (n, rows, cols // 32, 16), generator=g, dtype=torch.uint8),
                scales)

    x = torch.randn(6, h, generator=g)
    tri = _topk_triples(6, n, 2, seed=8)
    for fmt, bank in (("q4g", q4g_bank), ("mxfp4", mx_bank)):
        banks = ExpertBankView(fmt, bank(2 * i, h), bank(h, i), n, h, i)
        out = cpu_moe_banks(x, *tri, banks, isa=isa, activations="q8")
        err = q8_accumulation_error(out, x, *tri, banks)
        assert err <= Q8_ACCUMULATION_TOLERANCE, (fmt, err)


@pytest.mark.parametrize("isa", ISAS)
def test_bf16_input_and_nan_rows(isa):
    """bf16 x is widened before quantising; a NaN in one token's x makes exactly that token's
    output NaN (its blocks get d = NaN), as in the reference."""
    banks = _banks("q4g", {}, 6, 128, 64, seed=2)
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(1)).bfloat16()
    tri = _topk_triples(5, 6, 2, seed=3)
    out = cpu_moe_banks(x, *tri, banks, isa=isa, activations="q8")
    assert q8_accumulation_error(out, x.float(), *tri, banks) <= Q8_ACCUMULATION_TOLERANCE
    x = x.float()
    x[2, 70] = float("nan")
    out = cpu_moe_banks(x, *tri, banks, isa=isa, activations="q8")
    ref = cpu_moe_reference_q8(x, *tri, banks)
    assert torch.isnan(out[2]).all() and torch.isnan(ref[2]).all()
    keep = torch.tensor([0, 1, 3, 4])
    assert relative_rms_error(ref[keep], out[keep]) <= Q8_ACCUMULATION_TOLERANCE


AVX512 = [isa for isa in ISAS if isa.startswith("avx512")]


@pytest.mark.skipif(not AVX512 or "avx2" not in ISAS, reason="needs the avx2 and avx512 variants")
@pytest.mark.parametrize("fmt,kwargs", VARIANTS + [("q4g", dict(group_size=96, symmetric=False))],
                         ids=VARIANT_IDS + ["q4g-zeros-g96"])
@pytest.mark.parametrize("t,h,i,n,k", [(1, 2048, 768, 4, 4), (1, 256, 160, 5, 2),
                                       (3, 96, 288, 7, 3), (17, 800, 96, 6, 2),
                                       (64, 512, 544, 4, 2)])
def test_avx512_variants_are_bit_identical_to_avx2(fmt, kwargs, t, h, i, n, k):
    """The avx512 variants' q8 kernel (vpdpbusd with AVX512_VNNI, else the AVX2 code) gives the
    AVX2 kernel's outputs bit for bit: block sums are exact integers and the floating-point steps
    are shared. Shapes with full and partial 256-column chunks (H 800 = 3 chunks + 4 blocks,
    I 544 = 2 + 1 block, 96 and 160 only partial ones), one to 64 tokens."""
    g = kwargs.get("group_size", 32)
    h, i = -(-h // g) * g, -(-i // g) * g  # whole quantisation groups
    banks = _banks(fmt, kwargs, n, h, i, seed=11)
    x = torch.randn(t, h, generator=torch.Generator().manual_seed(t * h))
    tri = _topk_triples(t, n, k, seed=t + 1)
    want = cpu_moe_banks(x, *tri, banks, isa="avx2", activations="q8")
    for isa in AVX512:
        assert torch.equal(cpu_moe_banks(x, *tri, banks, isa=isa, activations="q8"), want), isa


def test_quantizer_hand_checked_example():
    """d = absmax / 127 and round-half-even(v / d), checked by hand on four blocks."""
    v = torch.zeros(1, 128)
    v[0, :6] = torch.tensor([127.0, -63.5, 0.5, 1.5, 2.5, -2.5])  # absmax 127: d = 1
    v[0, 32:36] = torch.tensor([-254.0, 1.0, 3.0, -5.0])  # absmax 254: d = 2
    v[0, 96:98] = torch.tensor([1.0, float("inf")])  # block 2 stays all zero; block 3 non-finite
    q_want = torch.zeros(1, 128, dtype=torch.int8)
    q_want[0, :6] = torch.tensor([127, -64, 0, 2, 2, -2], dtype=torch.int8)
    q_want[0, 32:36] = torch.tensor([-127, 0, 2, -2], dtype=torch.int8)
    d_want = torch.tensor([[1.0, 2.0, 0.0, float("nan")]])
    for q, d in (quantize_q8_blocks(v), quantize_q8(v)):
        assert torch.equal(q, q_want)
        assert torch.equal(d[:, :3], d_want[:, :3]) and torch.isnan(d[0, 3])


def test_kernel_quantizer_is_bit_equal_to_the_reference():
    g = torch.Generator().manual_seed(0)
    v = torch.randn(64, 256, generator=g) * torch.logspace(-30, 30, 64)[:, None]
    v[3, :40] = 0.0
    v[5, 7] = -float("inf")
    v[6, 100] = float("nan")
    v[7] = torch.randint(-5, 6, (256,), generator=g) * 0.5  # many exact .5 ties
    v[8, :32] = 1e-40  # subnormal block
    q, d = quantize_q8(v)
    q_ref, d_ref = quantize_q8_blocks(v)
    assert torch.equal(q, q_ref)
    assert torch.equal(d.nan_to_num(nan=-1.0), d_ref.nan_to_num(nan=-1.0))
    assert int(torch.isnan(d).sum()) == 2


def test_bad_activations_are_clear_errors():
    x = torch.randn(2, 64)
    tri = _topk_triples(2, 4, 2, seed=0)
    g = torch.Generator().manual_seed(0)
    gate_up, down = torch.randn(4, 64, 64, generator=g), torch.randn(4, 64, 32, generator=g)
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        dense = ExpertBankView.dense(gate_up.to(dtype), down.to(dtype))
        message = f"activations='q8' needs 4-bit expert banks (mxfp4 or q4g), got {name}"
        with pytest.raises(ValueError) as info:
            cpu_moe_banks(x, *tri, dense, activations="q8")
        assert str(info.value) == message
        with pytest.raises(ValueError) as info:
            cpu_moe(x, *tri, gate_up.to(dtype), down.to(dtype), activations="q8")
        assert str(info.value) == message
    q4 = build_banks(gate_up, down, "q4g")
    for bad in ("int8", "Q8", ""):
        with pytest.raises(ValueError) as info:
            cpu_moe_banks(x, *tri, q4, activations=bad)
        assert str(info.value) == f"unknown activations '{bad}'; expected one of: fp32, q8, bf16"
    with pytest.raises(ValueError, match=r"q8 activations need 4-bit expert banks .* got fp32"):
        cpu_moe_reference_q8(x, *tri, ExpertBankView.dense(gate_up, down))
    with pytest.raises(ValueError) as info:
        quantize_q8(torch.zeros(2, 40))
    assert str(info.value) == "v [2, 40]: C must be a multiple of 32"
    with pytest.raises(ValueError, match="must be a multiple of 32"):
        quantize_q8_blocks(torch.zeros(2, 40))
