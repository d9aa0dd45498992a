"""The C++ kernel's bf16-activation path on fp8 banks (``activations="bf16"``) on every ISA variant.

Bounds (relative RMS): against ``cpu_moe_reference(..., activations="bf16")`` on the dequantised
weights within ``BF16_ACCUMULATION_TOLERANCE`` up to rounding ambiguity
(``rounding.bf16_accumulation_error``); against the fp32 reference within ``BF16_TOLERANCE`` (and
above 1e-4: the activations really are rounded). On ``avx512_bf16`` with AVX512_VBMI this runs
``fp8_dpbf16`` (e4m3 -> bf16 by table lookup, ``vdpbf16ps``); elsewhere the fp32-activation fp8
kernel of the variant on the rounded values.
Shape letters: T tokens, H hidden, I expert intermediate, N flat expert ids, K top-k.
"""

from __future__ import annotations

import pytest
import torch

from freetoken.ops.cpu_moe import (
    BF16_ACCUMULATION_TOLERANCE,
    BF16_TOLERANCE,
    ExpertBankView,
    cpu_moe_reference_banks,
    relative_rms_error,
)
from freetoken.ops.cpu_moe.cpu import cpu_has_avx512_vbmi, cpu_moe_banks, kernels, supported_isas
from freetoken.ops.cpu_moe.rounding import bf16_accumulation_error
from tests.ops.test_cpu_moe_fp8 import SHAPES, _banks, _routing, _weights, every_code_banks

ISAS = supported_isas()
DPBF16 = "avx512_bf16" in ISAS and cpu_has_avx512_vbmi()


def _check(isa, x, tri, banks, **glu) -> torch.Tensor:
    out = cpu_moe_banks(x, *tri, banks, isa=isa, activations="bf16", **glu)
    assert out.shape == (x.shape[0], banks.hidden) and out.dtype == torch.float32
    gate_up, down = banks.dequantize()
    err = bf16_accumulation_error(out, x.float(), *tri, gate_up, down, **glu)
    assert err <= BF16_ACCUMULATION_TOLERANCE, f"fp8 {isa}: vs bf16 reference {err:.3g}"
    dense = relative_rms_error(cpu_moe_reference_banks(x.float(), *tri, banks, **glu), out)
    assert 1e-4 < dense <= BF16_TOLERANCE, f"fp8 {isa}: vs fp32 reference {dense:.3g}"
    return out


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("t,h,i,n,k,block", SHAPES)
def test_matches_bf16_reference(isa, t, h, i, n, k, block):
    banks = _banks(n, h, i, block)
    x = torch.randn(t, h, generator=torch.Generator().manual_seed(t))
    _check(isa, x, _routing(t, n, k, seed=t), banks)
    _check(isa, x.bfloat16(), _routing(t, n, k, seed=t + 1), banks)  # bf16 hidden states


@pytest.mark.parametrize("isa", ISAS)
def test_gpt_oss_options(isa):
    """Biases and the clamped SwiGLU with bf16 activations (ragged 128 x 128 blocks)."""
    t, h, i, n, k, block = 3, 200, 72, 6, 3, (128, 128)
    banks = _banks(n, h, i, block, seed=1, gain=3.5)
    _, _, gate_up_bias, down_bias = _weights(n, h, i, 1, 3.5)
    x = torch.randn(t, h, generator=torch.Generator().manual_seed(3))
    _check(isa, x, _routing(t, n, k, seed=4), banks, gate_up_bias=gate_up_bias,
           down_bias=down_bias, swiglu_limit=7.0)


def test_every_code_value_and_nan():
    """All 256 e4m3 codes (subnormals included) decode right through the bf16 tables; a NaN code
    (0x7F / 0xFF) makes exactly its hidden column NaN, on every variant."""
    n, h, i = 3, 192, 32  # 192: three 64-column steps per row, the last block ragged
    g = torch.Generator().manual_seed(5)
    banks = every_code_banks(n, h, i, (128, 128), g)
    assert torch.unique(banks.gate_up[0].view(torch.uint8)).numel() == 254
    x = torch.randn(5, h, generator=g)
    for isa in ISAS:
        _check(isa, x, (torch.arange(5), torch.full((5,), 2), torch.rand(5, generator=g)), banks)
    down = banks.down[0].view(torch.uint8).clone()
    down[2, 9, 4] = 0xFF  # -NaN
    nan_banks = ExpertBankView("fp8", banks.gate_up, (down.view(torch.float8_e4m3fn),
                                                      banks.down[1]), n, h, i,
                               block_size=(128, 128))
    for isa in ISAS:
        out = cpu_moe_banks(x, torch.arange(5), torch.full((5,), 2), torch.ones(5), nan_banks,
                            isa=isa, activations="bf16")
        assert torch.isnan(out[:, 9]).all(), isa
        assert torch.isfinite(torch.cat([out[:, :9], out[:, 10:]], dim=1)).all(), isa


def test_variants_agree_and_are_deterministic():
    """Every variant multiplies the same bf16-rounded activations: only fp32 summation order
    (and vdpbf16ps's flushing of denormals) separates them."""
    banks = _banks(8, 200, 72, (128, 128))
    x = torch.randn(5, 200)
    tri = _routing(5, 8, 2, seed=6)
    outs = {isa: cpu_moe_banks(x, *tri, banks, isa=isa, activations="bf16") for isa in ISAS}
    for isa in ISAS:
        assert torch.equal(outs[isa], cpu_moe_banks(x, *tri, banks, isa=isa, activations="bf16"))
        assert relative_rms_error(outs["scalar"], outs[isa]) < 1e-5, isa


@pytest.mark.parametrize("isa", ISAS)
def test_runs_its_kernel(isa):
    """avx512_bf16 runs fp8_dpbf16 when the CPU has AVX512_VBMI; every other case the variant's
    fp32-activation fp8 kernel."""
    banks = _banks(8, 256, 128, (128, 128))
    want = {"scalar": "fp8_scalar", "avx2": "fp8_avx2"}.get(isa, "fp8_avx512")
    if isa == "avx512_bf16" and DPBF16:
        want = "fp8_dpbf16"
    before = {name: calls for name, _, calls in kernels()}
    cpu_moe_banks(torch.randn(2, 256), *_routing(2, 8, 2, seed=7), banks, isa=isa,
                  activations="bf16")
    after = {name: calls for name, _, calls in kernels()}
    assert {name for name in after if after[name] != before[name]} == {want}


def test_q8_is_refused_on_fp8_banks():
    banks = _banks(8, 256, 128, (128, 128))
    with pytest.raises(ValueError) as exc:
        cpu_moe_banks(torch.randn(2, 256), *_routing(2, 8, 2, seed=7), banks, activations="q8")
    assert str(exc.value) == ("activations='q8' is not supported with fp8 expert banks (they "
                              "take activations='fp32' or 'bf16')")
