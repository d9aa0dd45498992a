"""moe_forward (the routed-expert function an expert cache will replace) against a naive loop."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import freetoken.models.moe_forward as moe_forward_module
from freetoken.models.moe_forward import ExpertWeights, kernel_max_tokens, moe_forward
from freetoken.ops.cpu_moe import relative_rms_error

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


def test_kernel_max_tokens_is_eight_rows_per_expert_on_average() -> None:
    assert kernel_max_tokens(64, 8) == 64  # the small presets
    assert kernel_max_tokens(128, 8) == 128
    assert kernel_max_tokens(6, 2) == 24
    assert kernel_max_tokens(6, 8) == 8  # never below the decode bound


@pytest.mark.parametrize("t", [9, 17, 24, 25])
def test_short_fp32_prefill_runs_the_expert_kernel(t: int, monkeypatch) -> None:
    calls = []
    kernel = moe_forward_module.cpu_moe
    monkeypatch.setattr(moe_forward_module, "cpu_moe",
                        lambda *a, **kw: calls.append(1) or kernel(*a, **kw))
    gen = torch.Generator().manual_seed(100 + t)
    exact = ExpertWeights(layer=0, num_experts=E, hidden=H, intermediate=I, dtype=torch.float64)
    with torch.no_grad():
        exact.gate_up.copy_(torch.randn(E, 2 * I, H, generator=gen, dtype=torch.float64))
        exact.down.copy_(torch.randn(E, H, I, generator=gen, dtype=torch.float64))
    experts = ExpertWeights(layer=0, num_experts=E, hidden=H, intermediate=I, dtype=torch.float32)
    with torch.no_grad():
        experts.gate_up.copy_(exact.gate_up)
        experts.down.copy_(exact.down)
    x = torch.randn(t, H, generator=gen, dtype=torch.float64)
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(t)])
    weights = torch.rand(t, K, generator=gen, dtype=torch.float64)
    out = moe_forward(x.float(), ids, weights.float(), experts)
    assert out.dtype == torch.float32
    assert len(calls) == (1 if t <= kernel_max_tokens(E, K) else 0)
    assert relative_rms_error(naive(x, ids, weights, exact), out.double()) <= 1e-6
