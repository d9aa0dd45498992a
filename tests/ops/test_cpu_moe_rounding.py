"""The rounding-ambiguity comparison (freetoken/ops/cpu_moe/rounding.py) that the q8 and bf16
activation bounds use: it removes exactly the alternatives the reference flags, and nothing that
is spread over the output."""

from __future__ import annotations

import torch

from freetoken.ops.cpu_moe import relative_rms_error
from freetoken.ops.cpu_moe.rounding import (
    RoundingCandidates,
    bf16_alternatives,
    bf16_rounding_candidates,
    q8_alternatives,
    relative_rms_error_up_to_rounding,
)


def _candidates(h: int = 256, f: int = 6, seed: int = 0) -> tuple[torch.Tensor, RoundingCandidates]:
    g = torch.Generator().manual_seed(seed)
    ref = torch.randn(3, h, generator=g)
    token = torch.tensor([0, 0, 1, 1, 2, 2])[:f]
    effect = torch.randn(f, h, generator=g) * 1e-3
    return ref, RoundingCandidates(token, effect)


def test_no_candidates_is_the_plain_error():
    ref, _ = _candidates()
    out = ref + 1e-4 * torch.randn(ref.shape, generator=torch.Generator().manual_seed(1))
    plain = relative_rms_error(ref, out)
    assert relative_rms_error_up_to_rounding(ref, out, RoundingCandidates.empty(256)) == plain


def test_flagged_alternatives_are_removed_exactly():
    ref, cands = _candidates()
    out = ref.clone()
    out[0] += cands.effect[1]  # token 0 took candidate 1's other rounding
    out[2] += cands.effect[4] + cands.effect[5]
    assert relative_rms_error(ref, out) > 1e-4
    assert relative_rms_error_up_to_rounding(ref, out, cands) < 1e-7


def test_spread_error_is_not_absorbed():
    ref, cands = _candidates()
    noise = 2e-4 * torch.randn(ref.shape, generator=torch.Generator().manual_seed(2))
    out = ref + noise + torch.cat([cands.effect[:1], torch.zeros(2, 256)])
    err = relative_rms_error_up_to_rounding(ref, out, cands)
    assert 0.9 * relative_rms_error(ref, ref + noise) <= err


def test_non_finite_output_is_infinite():
    ref, cands = _candidates()
    out = ref.clone()
    out[1, 3] = float("nan")
    assert relative_rms_error_up_to_rounding(ref, out, cands) == float("inf")


def test_bf16_alternatives_flag_only_near_midpoints():
    one_ulp = 2.0**-7  # bf16 spacing in [1, 2)
    act = torch.tensor([1.0 + one_ulp / 2 + 5e-7, 1.0 + one_ulp / 4, 1.5, -(1.0 + 1.5 * one_ulp)])
    ambiguous, step = bf16_alternatives(act, torch.full_like(act, 1e-6))
    assert ambiguous.tolist() == [True, False, False, True]
    # act[0] rounds up to 1 + ulp, its alternative is 1; act[3] rounds to -(1 + 2 ulp), alt -(1 + ulp)
    assert step[0].item() == -one_ulp and step[3].item() == one_ulp


def test_q8_alternatives_flag_only_near_half_quanta():
    act = torch.zeros(1, 32)
    act[0, :4] = torch.tensor([127.0, 2.5 + 5e-7, 2.25, -3.5 - 5e-7])  # d = 1
    ambiguous, step = q8_alternatives(act, torch.full_like(act, 1e-5), torch.tensor([[1.0]]), 32)
    assert ambiguous[0, :4].tolist() == [False, True, False, True]
    assert not ambiguous[0, 4:].any()
    assert step[0, 1].item() == -1.0 and step[0, 3].item() == 1.0


def test_bf16_candidates_are_a_few_percent_of_the_activations():
    g = torch.Generator().manual_seed(0)
    n, h, i = 4, 512, 256
    gate_up = (torch.randn(n, 2 * i, h, generator=g) / h**0.5).bfloat16()
    down = (torch.randn(n, h, i, generator=g) / i**0.5).bfloat16()
    x = torch.randn(2, h, generator=g)
    tri = (torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 2, 3]), torch.rand(4, generator=g))
    cands = bf16_rounding_candidates(x, *tri, gate_up, down)
    assert 0 < cands.token.numel() <= 0.2 * 4 * i
    assert cands.effect.shape == (cands.token.numel(), h)
