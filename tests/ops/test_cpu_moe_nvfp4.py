"""C++ CPU expert kernel on NVFP4 banks (ModelOpt layout: e2m1 codes, e4m3 scales per 16
columns, a per-row fp32 global scale) against the fp32 torch reference on the dequantised
weights, on every ISA variant.

The bound is the kernel's FP32_ACCUMULATION_TOLERANCE: the kernel multiplies the exact
``e2m1 * e4m3`` products and applies the global scale to each row's sum, the reference uses the
ModelOpt / vLLM dequantised weights ``fl(e2m1 * fl(e4m3 * global))``, so fp32 summation order
and at most two roundings per weight differ. Shapes include C = 16 (mod 32), the last group of a
row read alone, and fused gate_up banks whose gate and up rows have different global scales.
Shape letters: T tokens, H hidden, I expert intermediate, N flat expert ids, K top-k.
"""

from __future__ import annotations

import functools

import pytest
import torch

from freetoken.ops.cpu_moe import (
    FP32_ACCUMULATION_TOLERANCE,
    ExpertBankView,
    build_banks,
    cpu_moe_reference_banks,
    relative_rms_error,
)
from freetoken.ops.cpu_moe.cpu import cpu_moe_banks, kernels, supported_isas

ISAS = supported_isas()
LIMIT = 7.0  # gpt-oss's swiglu_limit
# (T, H, I, N, K); H and I multiples of 16. With 2 threads, N33-K9 runs one task per routed
# expert, the others the chunked phases; T37 puts several tokens on each expert (scratch).
SHAPES = [
    pytest.param(1, 256, 128, 8, 4, id="decode-T1"),
    pytest.param(3, 208, 48, 6, 3, id="odd-T3-H208-I48"),
    pytest.param(7, 16, 80, 5, 3, id="tiny-H16-I80"),
    pytest.param(37, 96, 112, 7, 5, id="prefill-T37"),
    pytest.param(1, 64, 48, 33, 9, id="decode-N33-K9"),
]


@functools.cache
def _weights(n: int, h: int, i: int, seed: int, gain: float) -> tuple[torch.Tensor, ...]:
    """fp32 ``gate_up [N, 2I, H]`` (up rows 4x the gate rows, so their globals differ),
    ``down [N, H, I]``, ``gate_up_bias [N, 2I]``, ``down_bias [N, H]``."""
    g = torch.Generator().manual_seed(seed)
    gate_up = torch.randn(n, 2 * i, h, generator=g) * (gain / h**0.5)
    gate_up[:, i:] *= 4.0
    down = torch.randn(n, h, i, generator=g) / i**0.5
    return (gate_up, down, torch.randn(n, 2 * i, generator=g) * 2.0,
            torch.randn(n, h, generator=g))


@functools.cache
def _banks(n: int, h: int, i: int, seed: int = 0, gain: float = 1.0) -> ExpertBankView:
    gate_up, down, _, _ = _weights(n, h, i, seed, gain)
    return build_banks(gate_up, down, "nvfp4")


def _routing(t: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Distinct top-k experts per token flattened to triples, with some ``-1`` (skipped)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(t)]).flatten()
    ids[1::5] = -1
    return torch.arange(t).repeat_interleave(k), ids, torch.rand(t * k, generator=g)


def _check(isa, x, tri, banks, **glu) -> torch.Tensor:
    ref = cpu_moe_reference_banks(x, *tri, banks, **glu)
    out = cpu_moe_banks(x, *tri, banks, isa=isa, **glu)
    assert out.shape == ref.shape and out.dtype == torch.float32
    err = relative_rms_error(ref, out)
    assert err <= FP32_ACCUMULATION_TOLERANCE, f"nvfp4 {isa}: relative RMS error {err:.3g}"
    return out


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("t,h,i,n,k", SHAPES)
def test_matches_reference(isa, t, h, i, n, k):
    banks = _banks(n, h, i)
    glob = banks.gate_up[2]
    assert glob.shape == (n, 2 * i) and (glob[:, i:] > 3 * glob[:, :i]).all()
    x = torch.randn(t, h, generator=torch.Generator().manual_seed(t))
    _check(isa, x, _routing(t, n, k, seed=t), banks)
    _check(isa, x.bfloat16(), _routing(t, n, k, seed=t + 1), banks)  # bf16 hidden states


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("t,h,i,n,k", SHAPES[1:4])
def test_gpt_oss_options(isa, t, h, i, n, k):
    """Biases and the clamped SwiGLU (limit 7, where some g and u pass it) on nvfp4 banks."""
    banks = _banks(n, h, i, seed=1, gain=2.0)
    _, _, gate_up_bias, down_bias = _weights(n, h, i, 1, 2.0)
    glu = dict(gate_up_bias=gate_up_bias, down_bias=down_bias, swiglu_limit=LIMIT)
    x = torch.randn(t, h, generator=torch.Generator().manual_seed(3))
    tri = _routing(t, n, k, seed=4)
    gate_up, _ = banks.dequantize()
    keep = tri[1] >= 0
    gu = torch.einsum("ph,pjh->pj", x[tri[0][keep]], gate_up[tri[1][keep]])
    gu = gu + gate_up_bias[tri[1][keep]]
    assert (gu[:, :i] > LIMIT).any() and (gu[:, i:].abs() > LIMIT).any()  # the clamps bite
    out = _check(isa, x, tri, banks, **glu)
    assert relative_rms_error(cpu_moe_reference_banks(x, *tri, banks), out) > 0.1
    _check(isa, x, tri, banks, down_bias=down_bias)
    _check(isa, x, tri, banks, swiglu_limit=float("inf"), swiglu_alpha=1.0)


@pytest.mark.parametrize("isa", ISAS)
def test_hostile_routings(isa):
    t, h, i, n = 24, 176, 48, 8
    banks = _banks(n, h, i, seed=2)
    x = torch.randn(t, h)
    tok = torch.arange(t)
    # Every token to one expert (the other 7 idle): the scratch schedule.
    _check(isa, x, (tok, torch.full((t,), 5), torch.rand(t)), banks)
    # Duplicates, negative weights, two tokens on one expert (the two-vector schedule).
    tok2 = torch.tensor([0, 0, 1, 1, 1, 23])
    ids2 = torch.tensor([3, 3, 2, 2, 7, 3])
    _check(isa, x, (tok2, ids2, torch.tensor([0.5, 0.25, 1.0, -1.0, 0.3, 2.0])), banks)
    out = _check(isa, x, (tok2, torch.tensor([-1, 3, -1, -1, -1, -1]), torch.ones(6)), banks)
    assert torch.equal(out[1:], torch.zeros(t - 1, h)) and out[0].abs().sum() > 0


def test_every_code_and_scale_value():
    """Random bytes cover all 16 codes and every finite e4m3 scale byte, subnormal ones
    included; a wrongly decoded one would move the result far past the bound."""
    n, h, i = 3, 80, 48
    g = torch.Generator().manual_seed(5)

    def bank(rows, cols):
        codes = torch.randint(0, 256, (n, rows, cols // 2), generator=g, dtype=torch.uint8)
        scales = torch.randint(0, 256, (n, rows, cols // 16), generator=g, dtype=torch.uint8)
        scales.view(-1)[:256] = torch.arange(256, dtype=torch.uint8)
        scales[(scales & 0x7F) == 0x7F] = 0x38  # no NaN scales
        glob = torch.rand(n, rows, generator=g) * 1e-2 + 1e-3
        return codes, scales.view(torch.float8_e4m3fn), glob

    banks = ExpertBankView("nvfp4", bank(2 * i, h), bank(h, i), n, h, i)
    assert torch.unique(banks.gate_up[1].view(torch.uint8)).numel() == 254
    x = torch.randn(5, h, generator=g)
    for tri in [(torch.tensor([0]), torch.tensor([1]), torch.tensor([1.0])),
                (torch.arange(5), torch.full((5,), 2), torch.rand(5, generator=g))]:
        for isa in ISAS:
            _check(isa, x, tri, banks)
    # A NaN scale byte (0x7F) in one down row makes exactly that hidden column NaN.
    scales = banks.down[1].view(torch.uint8).clone()
    scales[2, 9, 1] = 0x7F
    nan_banks = ExpertBankView("nvfp4", banks.gate_up, (banks.down[0],
                               scales.view(torch.float8_e4m3fn), banks.down[2]), n, h, i)
    for isa in ISAS:
        out = cpu_moe_banks(x, torch.arange(5), torch.full((5,), 2), torch.ones(5), nan_banks,
                            isa=isa)
        assert torch.isnan(out[:, 9]).all(), isa
        assert torch.isfinite(torch.cat([out[:, :9], out[:, 10:]], dim=1)).all(), isa


def test_variants_agree_and_are_deterministic():
    banks = _banks(8, 208, 48)
    x = torch.randn(5, 208)
    tri = _routing(5, 8, 2, seed=6)
    outs = {isa: cpu_moe_banks(x, *tri, banks, isa=isa) for isa in ISAS}
    for isa in ISAS:
        assert torch.equal(outs[isa], cpu_moe_banks(x, *tri, banks, isa=isa))
    if "avx2" in outs:
        assert relative_rms_error(outs["scalar"], outs["avx2"]) < 1e-6


@pytest.mark.parametrize("isa", ISAS)
def test_runs_its_kernel(isa):
    """scalar runs nvfp4_scalar; every other variant runs the AVX2 code (isa.h)."""
    banks = _banks(8, 256, 128)
    want = "nvfp4_scalar" if isa == "scalar" else "nvfp4_avx2"
    before = {name: calls for name, _, calls in kernels()}
    cpu_moe_banks(torch.randn(2, 256), *_routing(2, 8, 2, seed=7), banks, isa=isa)
    after = {name: calls for name, _, calls in kernels()}
    assert {name for name in after if after[name] != before[name]} == {want}
