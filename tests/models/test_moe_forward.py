"""moe_forward (the routed-expert function an expert cache will replace) against a naive loop."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from freetoken.models.moe_forward import ExpertWeights, moe_forward

E, H, I, K = 6, 16, 8, 2


def naive(x, ids, weights, experts):
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate, up = experts.gate_up[e, :I], experts.gate_up[e, I:]
            y = (F.silu(x[t] @ gate.T) * (x[t] @ up.T)) @ experts.down[e].T
            out[t] += weights[t, j] * y
    return out


@pytest.mark.parametrize("t", [1, 2, 9])
def test_matches_naive(t: int) -> None:
    gen = torch.Generator().manual_seed(t)
    experts = ExpertWeights(layer=0, num_experts=E, hidden=H, intermediate=I, dtype=torch.float64)
    with torch.no_grad():
        experts.gate_up.copy_(torch.randn(E, 2 * I, H, generator=gen, dtype=torch.float64))
        experts.down.copy_(torch.randn(E, H, I, generator=gen, dtype=torch.float64))
    x = torch.randn(t, H, generator=gen, dtype=torch.float64)
    # experts 0..3 only (4 and 5 get no token), distinct per token, shared across tokens
    ids = torch.stack([torch.randperm(4, generator=gen)[:K] for _ in range(t)])
    weights = torch.rand(t, K, generator=gen, dtype=torch.float64)
    out = moe_forward(x, ids, weights, experts)
    assert out.shape == (t, H) and out.dtype == torch.float64
    assert (out - naive(x, ids, weights, experts)).abs().max().item() < 1e-12


def test_weight_targets_name_every_expert() -> None:
    experts = ExpertWeights(layer=3, num_experts=E, hidden=H, intermediate=I, dtype=torch.float32)
    targets = experts.weight_targets("model.layers.3.mlp.experts.")
    assert len(targets) == 3 * E
    assert targets["model.layers.3.mlp.experts.5.up_proj.weight"].dest.shape == (I, H)
    assert targets["model.layers.3.mlp.experts.0.down_proj.weight"].dest.shape == (H, I)
