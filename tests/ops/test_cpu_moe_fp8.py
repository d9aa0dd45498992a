"""C++ CPU expert kernel on fp8 block-quantised banks (float8 e4m3fn values, fp32 block scales)
against the fp32 torch reference on the dequantised weights, on every ISA variant.

The bound is the kernel's FP32_ACCUMULATION_TOLERANCE: the kernel decodes e4m3 exactly and
scales each block's fp32 partial sum (the scratch schedule of many vectors multiplies
``fl(e4m3 * scale)``, the reference's own weights), so only fp32 summation order and that one
rounding per weight differ. Block shapes cover the releases' 128 x 128 with ragged last blocks
on both axes, odd shapes that are not multiples of 16, and single-row blocks.
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
# (T, H, I, N, K, block_size). With 2 threads, N33-K9 runs one task per routed expert, the
# others the chunked phases; T37 puts several tokens on each expert (the scratch schedule).
SHAPES = [
    pytest.param(1, 256, 128, 8, 4, (128, 128), id="decode-T1-128x128"),
    pytest.param(3, 200, 72, 6, 3, (128, 128), id="odd-T3-H200-I72-ragged128"),
    pytest.param(7, 33, 5, 5, 3, (16, 24), id="tiny-H33-I5-block16x24"),
    pytest.param(37, 96, 40, 7, 5, (1, 7), id="prefill-T37-block1x7"),
    pytest.param(1, 64, 48, 33, 9, (3, 16), id="decode-N33-K9-block3x16"),
]


@functools.cache
def _weights(n: int, h: int, i: int, seed: int, gain: float) -> tuple[torch.Tensor, ...]:
    """fp32 ``gate_up [N, 2I, H]``, ``down [N, H, I]``, ``gate_up_bias [N, 2I]``,
    ``down_bias [N, H]``."""
    g = torch.Generator().manual_seed(seed)
    gate_up = torch.randn(n, 2 * i, h, generator=g) * (gain / h**0.5)
    down = torch.randn(n, h, i, generator=g) / i**0.5
    return (gate_up, down, torch.randn(n, 2 * i, generator=g) * 2.0,
            torch.randn(n, h, generator=g))


@functools.cache
def _banks(n: int, h: int, i: int, block: tuple[int, int], seed: int = 0,
           gain: float = 1.0) -> ExpertBankView:
    gate_up, down, _, _ = _weights(n, h, i, seed, gain)
    return build_banks(gate_up, down, "fp8", block_size=block)


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
    assert err <= FP32_ACCUMULATION_TOLERANCE, f"fp8 {isa}: relative RMS error {err:.3g}"
    return out


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("t,h,i,n,k,block", SHAPES)
def test_matches_reference(isa, t, h, i, n, k, block):
    banks = _banks(n, h, i, block)
    assert banks.block_size == block
    x = torch.randn(t, h, generator=torch.Generator().manual_seed(t))
    _check(isa, x, _routing(t, n, k, seed=t), banks)
    _check(isa, x.bfloat16(), _routing(t, n, k, seed=t + 1), banks)  # bf16 hidden states


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("t,h,i,n,k,block", SHAPES[1:4])
def test_gpt_oss_options(isa, t, h, i, n, k, block):
    """Biases and the clamped SwiGLU (limit 7, where some g and u pass it) on fp8 banks."""
    banks = _banks(n, h, i, block, seed=1, gain=3.5)
    _, _, gate_up_bias, down_bias = _weights(n, h, i, 1, 3.5)
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
    _check(isa, x, tri, banks, gate_up_bias=gate_up_bias)
    _check(isa, x, tri, banks, swiglu_limit=float("inf"), swiglu_alpha=1.0)


@pytest.mark.parametrize("isa", ISAS)
def test_hostile_routings(isa):
    t, h, i, n = 24, 160, 48, 8
    banks = _banks(n, h, i, (128, 128), seed=2)
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


def every_code_banks(n: int, h: int, i: int, block: tuple[int, int],
                     g: torch.Generator) -> ExpertBankView:
    """fp8 banks of uniformly random codes (all but the NaN ones, 0x7F / 0xFF, which become 1.0)
    and random positive block scales."""

    def bank(rows, cols):
        codes = torch.randint(0, 256, (n, rows, cols), generator=g, dtype=torch.uint8)
        codes[(codes & 0x7F) == 0x7F] = 0x38
        scales = torch.rand(n, -(-rows // block[0]), -(-cols // block[1]), generator=g) * 1e-2
        return codes.view(torch.float8_e4m3fn), scales + 1e-3

    return ExpertBankView("fp8", bank(2 * i, h), bank(h, i), n, h, i, block_size=block)


def test_every_code_value_and_nan():
    """Random bytes cover all 256 e4m3 codes (subnormals included): a wrongly decoded code would
    move the result far past the bound. A NaN code (0x7F / 0xFF) in one down row makes exactly
    that hidden column NaN, on every variant and schedule."""
    n, h, i = 3, 64, 32
    g = torch.Generator().manual_seed(5)
    banks = every_code_banks(n, h, i, (16, 16), g)
    assert torch.unique(banks.gate_up[0].view(torch.uint8)).numel() == 254
    x = torch.randn(5, h, generator=g)
    for tri in [(torch.tensor([0]), torch.tensor([1]), torch.tensor([1.0])),
                (torch.arange(5), torch.full((5,), 2), torch.rand(5, generator=g))]:
        for isa in ISAS:
            _check(isa, x, tri, banks)
    down = banks.down[0].view(torch.uint8).clone()
    down[2, 9, 4] = 0xFF  # -NaN
    nan_banks = ExpertBankView("fp8", banks.gate_up, (down.view(torch.float8_e4m3fn),
                                                      banks.down[1]), n, h, i, block_size=(16, 16))
    for isa in ISAS:
        out = cpu_moe_banks(x, torch.arange(5), torch.full((5,), 2), torch.ones(5), nan_banks,
                            isa=isa)
        assert torch.isnan(out[:, 9]).all(), isa
        rest = torch.cat([out[:, :9], out[:, 10:]], dim=1)
        assert torch.isfinite(rest).all(), isa


def test_variants_agree_and_are_deterministic():
    banks = _banks(8, 200, 72, (128, 128))
    x = torch.randn(5, 200)
    tri = _routing(5, 8, 2, seed=6)
    outs = {isa: cpu_moe_banks(x, *tri, banks, isa=isa) for isa in ISAS}
    for isa in ISAS:
        assert torch.equal(outs[isa], cpu_moe_banks(x, *tri, banks, isa=isa))
    for isa in ISAS[1:]:
        assert relative_rms_error(outs["scalar"], outs[isa]) < 1e-6


@pytest.mark.parametrize("isa", ISAS)
def test_runs_its_kernel(isa):
    """Each variant runs its own fp8 kernel (isa.h rows_kernel_for): avx512_bf16 the avx512 one."""
    banks = _banks(8, 256, 128, (128, 128))
    want = {"scalar": "fp8_scalar", "avx2": "fp8_avx2"}.get(isa, "fp8_avx512")
    before = {name: calls for name, _, calls in kernels()}
    cpu_moe_banks(torch.randn(2, 256), *_routing(2, 8, 2, seed=7), banks, isa=isa)
    after = {name: calls for name, _, calls in kernels()}
    assert {name for name in after if after[name] != before[name]} == {want}
