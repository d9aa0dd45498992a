"""C++ CPU expert kernel on every weight format (bf16, fp32, mxfp4, q4g) vs the fp32 reference.

The reference runs on the exactly dequantised weights, so the bound is the kernel's arithmetic
error (FP32_ACCUMULATION_TOLERANCE on every variant: all multiply fp32 activations).
Shape letters: T tokens, H hidden, I expert intermediate, N flat expert ids, K top-k.
"""

from __future__ import annotations

import time

import pytest
import torch

from freetoken.ops.cpu_moe import (
    FP32_ACCUMULATION_TOLERANCE,
    ExpertBankView,
    build_banks,
    cpu_moe_reference,
    cpu_moe_reference_banks,
    relative_rms_error,
)
from freetoken.ops.cpu_moe.cpu import cpu_moe, cpu_moe_banks, submit, submit_banks, supported_isas

ISAS = supported_isas()
# (format, build_banks kwargs); q4g is covered symmetric, asymmetric and with groups of 64.
VARIANTS = [
    ("bf16", {}),
    ("fp32", {}),
    ("mxfp4", {}),
    ("q4g", {}),
    ("q4g", dict(symmetric=False)),
    ("q4g", dict(group_size=64, symmetric=False)),
]
VARIANT_IDS = ["bf16", "fp32", "mxfp4", "q4g-sym32", "q4g-asym32", "q4g-asym64"]


def _banks(fmt, kwargs, n, h, i, seed=0) -> ExpertBankView:
    g = torch.Generator().manual_seed(seed)
    gate_up = torch.randn(n, 2 * i, h, generator=g) / h**0.5  # [N, 2I, H]
    down = torch.randn(n, h, i, generator=g) / i**0.5  # [N, H, I]
    return build_banks(gate_up, down, fmt, **kwargs)


def _topk_triples(t: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(t)])  # [T, K]
    w = torch.rand(t, k, generator=g).softmax(-1)  # [T, K]
    return torch.arange(t).repeat_interleave(k), ids.flatten(), w.flatten()


def _check(isa, fmt, x, tok, ids, w, banks) -> torch.Tensor:
    ref = cpu_moe_reference_banks(x, tok, ids, w, banks)
    out = cpu_moe_banks(x, tok, ids, w, banks, isa=isa)
    assert out.shape == ref.shape and out.dtype == torch.float32
    err = relative_rms_error(ref, out)
    assert err <= FP32_ACCUMULATION_TOLERANCE, f"{fmt} {isa}: relative RMS error {err:.3g}"
    return out


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt,kwargs", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize(
    "t,h,i,n,k",
    [
        pytest.param(1, 256, 128, 8, 4, id="decode-T1"),
        pytest.param(16, 128, 192, 8, 2, id="prefill-T16"),
        pytest.param(128, 64, 128, 4, 2, id="prefill-T128"),
        pytest.param(3, 192, 64, 6, 3, id="odd-T3-H192"),
    ],
)
def test_matches_reference(isa, fmt, kwargs, t, h, i, n, k):
    banks = _banks(fmt, kwargs, n, h, i)
    x = torch.randn(t, h, generator=torch.Generator().manual_seed(t))
    _check(isa, fmt, x, *_topk_triples(t, n, k, seed=t), banks)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", ["bf16", "fp32"])
def test_dense_odd_shapes(isa, fmt):
    """Dense formats take any H and I (not multiples of 8 or 32)."""
    banks = _banks(fmt, {}, 6, 200, 37)
    x = torch.randn(7, 200).bfloat16()  # bf16 hidden states too
    _check(isa, fmt, x, *_topk_triples(7, 6, 3, seed=4), banks)


@pytest.mark.parametrize("fmt,kwargs,h,i,message", [
    ("mxfp4", {}, 200, 64,
     "mxfp4: the input dimension (last, size 200) must be a multiple of the group size 32"),
    ("mxfp4", {}, 64, 72,
     "mxfp4: the input dimension (last, size 72) must be a multiple of the group size 32"),
    ("q4g", {}, 96, 48,
     "q4g: the input dimension (last, size 48) must be a multiple of the group size 32"),
    ("q4g", dict(group_size=64), 96, 64,
     "q4g: the input dimension (last, size 96) must be a multiple of the group size 64"),
])
def test_4bit_needs_group_multiples(fmt, kwargs, h, i, message):
    with pytest.raises(ValueError) as exc:
        _banks(fmt, kwargs, 2, h, i)
    assert str(exc.value) == message


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt,kwargs", VARIANTS, ids=VARIANT_IDS)
def test_hostile_routings(isa, fmt, kwargs):
    t, h, i, n = 24, 128, 64, 8
    banks = _banks(fmt, kwargs, n, h, i, seed=1)
    x = torch.randn(t, h)
    tok = torch.arange(t)
    # Every token to one expert (the other 7 idle): the scratch schedule of the 4-bit formats.
    _check(isa, fmt, x, tok, torch.full((t,), 5), torch.rand(t), banks)
    # Duplicates, negative weights, two tokens on one expert (the fused 4-bit schedule).
    tok2 = torch.tensor([0, 0, 1, 1, 1, 23])
    ids2 = torch.tensor([3, 3, 2, 2, 7, 3])
    _check(isa, fmt, x, tok2, ids2, torch.tensor([0.5, 0.25, 1.0, -1.0, 0.3, 2.0]), banks)
    # Skipped triples (-1): only token 0 gets a result, every other row is exactly zero.
    ids3 = torch.tensor([-1, 3, -1, -1, -1, -1])
    out = _check(isa, fmt, x, tok2, ids3, torch.ones(6), banks)
    assert torch.equal(out[1:], torch.zeros(t - 1, h)) and out[0].abs().sum() > 0
    empty = torch.zeros(0, dtype=torch.int64)
    assert torch.equal(cpu_moe_banks(x, empty, empty, torch.zeros(0), banks, isa=isa),
                       torch.zeros(t, h))


@pytest.mark.parametrize("fmt,kwargs", VARIANTS, ids=VARIANT_IDS)
def test_variants_agree_and_are_deterministic(fmt, kwargs):
    banks = _banks(fmt, kwargs, 8, 128, 64, seed=2)
    x = torch.randn(5, 128)
    tri = _topk_triples(5, 8, 2, seed=6)
    outs = {isa: cpu_moe_banks(x, *tri, banks, isa=isa) for isa in ISAS}
    for isa in ISAS:
        assert torch.equal(outs[isa], cpu_moe_banks(x, *tri, banks, isa=isa))
    if "avx2" in outs:
        assert relative_rms_error(outs["scalar"], outs["avx2"]) < 1e-6


@pytest.mark.parametrize("isa", ISAS)
def test_fp32_banks_through_submit(isa):
    """submit() takes fp32 banks as-is (fp32 checkpoints) and matches the fp32 reference."""
    banks = _banks("fp32", {}, 8, 200, 72)
    gate_up, down = banks.gate_up[0], banks.down[0]
    x = torch.randn(9, 200)
    tri = _topk_triples(9, 8, 2, seed=8)
    out = cpu_moe(x, *tri, gate_up, down, isa=isa)
    assert relative_rms_error(cpu_moe_reference(x, *tri, gate_up, down), out) <= 1e-6
    assert torch.equal(out, cpu_moe_banks(x, *tri, ExpertBankView.dense(gate_up, down), isa=isa))


def test_handle_seconds():
    banks = _banks("fp32", {}, 8, 512, 256)
    x = torch.randn(64, 512)
    tri = _topk_triples(64, 8, 8, seed=3)
    t0 = time.perf_counter()
    slow = submit_banks(x, *tri, banks, isa="scalar")  # ~tens of ms
    quick = submit_banks(x[:1], *_topk_triples(1, 8, 1, seed=1), banks)  # queued behind it
    assert quick.seconds() == -1.0 and not quick.done()
    slow.wait()
    quick.wait()
    wall = time.perf_counter() - t0
    assert 0 < slow.seconds() <= wall and 0 < quick.seconds() <= wall
    assert quick.seconds() < slow.seconds()
    gate_up, down = banks.gate_up[0], banks.down[0]
    hd = submit(x[:2], *_topk_triples(2, 8, 2, seed=2), gate_up, down)
    hd.wait()
    assert hd.seconds() > 0 and hd.seconds() == hd.seconds()  # stable after done
