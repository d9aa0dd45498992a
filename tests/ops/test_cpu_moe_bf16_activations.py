"""The C++ kernel's bf16-activation path (``activations="bf16"``, bf16 banks) on every ISA variant.

Bounds (relative RMS): the kernel against ``cpu_moe_reference(..., activations="bf16")`` within
``BF16_ACCUMULATION_TOLERANCE`` up to rounding ambiguity (``rounding.bf16_accumulation_error``);
against the fp32 reference within ``BF16_TOLERANCE`` (the cost of rounding the activations, and
above 1e-4, so the rounding really happens). On ``avx512_bf16`` this runs ``vdpbf16ps``; on the
other variants the fp32 kernel on the rounded values.
Shape letters: T tokens, H hidden, I expert intermediate, N flat expert ids, K top-k.
"""

from __future__ import annotations

import pytest
import torch

from freetoken.ops.cpu_moe import (
    BF16_ACCUMULATION_TOLERANCE,
    BF16_TOLERANCE,
    build_banks,
    cpu_moe_reference,
    relative_rms_error,
)
from freetoken.ops.cpu_moe.cpu import cpu_moe, cpu_moe_banks, kernels, supported_isas
from freetoken.ops.cpu_moe.rounding import bf16_accumulation_error
from tests.ops.test_cpu_moe import _banks, _topk_triples

ISAS = supported_isas()


def _calls(name: str) -> int:
    return {n: c for n, _, c in kernels()}[name]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(
    "t,h,i,n,k",
    [
        pytest.param(1, 256, 512, 8, 2, id="decode-T1"),
        pytest.param(1, 2048, 768, 4, 4, id="decode-T1-H2048"),
        pytest.param(16, 256, 512, 8, 2, id="prefill-T16"),
        pytest.param(7, 200, 72, 6, 3, id="odd-H200-I72"),
        pytest.param(3, 33, 5, 4, 4, id="tiny-H33-I5-all-experts"),
        pytest.param(5, 80, 48, 5, 3, id="partial-blocks-H80-I48"),
    ],
)
def test_matches_bf16_reference(isa, t, h, i, n, k):
    gate_up, down = _banks(n, h, i, seed=t + h)
    x = torch.randn(t, h, generator=torch.Generator().manual_seed(h))
    tri = _topk_triples(t, n, k, seed=t)
    out = cpu_moe(x, *tri, gate_up, down, isa=isa, activations="bf16")
    assert out.shape == (t, h) and out.dtype == torch.float32
    err = bf16_accumulation_error(out, x, *tri, gate_up, down)
    assert err <= BF16_ACCUMULATION_TOLERANCE, f"{isa}: vs bf16 reference {err:.3g}"
    dense = relative_rms_error(cpu_moe_reference(x, *tri, gate_up, down), out)
    assert 1e-4 < dense <= BF16_TOLERANCE, f"{isa}: vs fp32 reference {dense:.3g}"


@pytest.mark.parametrize("isa", ISAS)
def test_bf16_x_and_banks_view(isa):
    """bf16 x (already bf16 values) and the ExpertBankView entry point give the same result."""
    gate_up, down = _banks(6, 128, 96, seed=1)
    x = torch.randn(9, 128, generator=torch.Generator().manual_seed(2))
    tri = _topk_triples(9, 6, 2, seed=3)
    banks = build_banks(gate_up.float(), down.float(), "bf16")
    a = cpu_moe(x.bfloat16(), *tri, gate_up, down, isa=isa, activations="bf16")
    b = cpu_moe_banks(x.bfloat16().float(), *tri, banks, isa=isa, activations="bf16")
    assert torch.equal(a, b)


@pytest.mark.skipif("avx512_bf16" not in ISAS, reason="needs a CPU with AVX512_BF16")
def test_avx512_bf16_runs_vdpbf16ps_only_for_bf16_activations():
    gate_up, down = _banks(4, 64, 32)
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(0))
    tri = _topk_triples(2, 4, 2, seed=0)
    before = _calls("bf16_dpbf16"), _calls("bf16_avx512")
    cpu_moe(x, *tri, gate_up, down, isa="avx512_bf16", activations="bf16")
    assert (_calls("bf16_dpbf16"), _calls("bf16_avx512")) == (before[0] + 1, before[1])
    cpu_moe(x, *tri, gate_up, down, isa="avx512_bf16")
    assert (_calls("bf16_dpbf16"), _calls("bf16_avx512")) == (before[0] + 1, before[1] + 1)


def test_bf16_activations_need_bf16_banks():
    g = torch.Generator().manual_seed(0)
    gate_up, down = torch.randn(2, 64, 32, generator=g), torch.randn(2, 32, 32, generator=g)
    tri = (torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64), torch.ones(1))
    with pytest.raises(ValueError, match=r"^activations='bf16' needs bf16 or fp8 expert banks, got fp32$"):
        cpu_moe(torch.randn(1, 32), *tri, gate_up, down, activations="bf16")
    banks = build_banks(gate_up, down, "q4g")
    with pytest.raises(ValueError, match=r"^activations='bf16' needs bf16 or fp8 expert banks, got q4g$"):
        cpu_moe_banks(torch.randn(1, 32), *tri, banks, activations="bf16")
    with pytest.raises(ValueError, match=r"^unknown activations 'fp16'; expected one of: fp32, "
                                         r"q8, bf16$"):
        cpu_moe(torch.randn(1, 32), *tri, gate_up, down, activations="fp16")


def test_reference_rounds_both_matrices_inputs():
    """The bf16 reference equals the fp32 reference on inputs that are bf16 values already, when
    ``silu(g) * u`` is exactly representable (zero gate rows: act = 0)."""
    gate_up, down = _banks(3, 64, 32)
    gate_up = gate_up.float()
    gate_up[:, :32] = 0  # g = 0, silu(0) = 0, act = 0 exactly
    x = torch.randn(4, 64).bfloat16().float()
    tri = _topk_triples(4, 3, 2, seed=1)
    a = cpu_moe_reference(x, *tri, gate_up, down.float(), activations="bf16")
    b = cpu_moe_reference(x, *tri, gate_up, down.float())
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="activations must be 'fp32' or 'bf16', got 'q8'"):
        cpu_moe_reference(x, *tri, gate_up, down.float(), activations="q8")
