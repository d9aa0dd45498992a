"""The gated delta rule: chunked prefill form == recurrent decode form == transformers' reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from freetoken.models.gated_deltanet import l2_normalize
from freetoken.ops.causal_conv import causal_conv1d
from freetoken.ops.gated_delta_rule import chunk_gated_delta_rule, recurrent_gated_delta_rule

HK, HV, DK, DV = 2, 6, 16, 8


def make_inputs(t: int, dtype=torch.float64, seed: int = 0):
    """Random q, k (normalised, q scaled), v, g (log decay <= 0), beta and a non-zero state."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=dtype)

    q = l2_normalize(randn(t, HK, DK), DK**-0.5).to(dtype)
    k = l2_normalize(randn(t, HK, DK)).to(dtype)
    a_log = torch.empty(HV, dtype=dtype).uniform_(1.0, 16.0, generator=gen).log()
    g = -a_log.exp() * F.softplus(randn(t, HV) + 1.0)
    beta = torch.sigmoid(randn(t, HV))
    return q, k, randn(t, HV, DV), g, beta, randn(HV, DK, DV) * 0.1


def naive(q, k, v, g, beta, state):
    """Per-head, per-token delta rule written directly from model-architectures.md §2.2."""
    state = state.clone()
    out = torch.zeros_like(v)
    for t in range(v.shape[0]):
        for h in range(HV):
            s = state[h] * g[t, h].exp()
            kh, qh = k[t, h // (HV // HK)], q[t, h // (HV // HK)]
            u = beta[t, h] * (v[t, h] - s.T @ kh)
            state[h] = s + torch.outer(kh, u)
            out[t, h] = state[h].T @ qh
    return out, state


@pytest.mark.parametrize("t", [1, 7, 63, 64, 83])
@pytest.mark.parametrize("chunk_size", [16, 64])
def test_chunked_equals_recurrent(t: int, chunk_size: int) -> None:
    q, k, v, g, beta, s0 = make_inputs(t)
    s_rec, s_chunk = s0.clone(), s0.clone()
    o_rec = recurrent_gated_delta_rule(q, k, v, g, beta, s_rec)
    o_chunk = chunk_gated_delta_rule(q, k, v, g, beta, s_chunk, chunk_size=chunk_size)
    o_ref, s_ref = naive(q, k, v, g, beta, s0)
    assert o_chunk.shape == o_rec.shape == (t, HV, DV)
    assert (o_rec - o_ref).abs().max().item() < 1e-12
    assert (s_rec - s_ref).abs().max().item() < 1e-12
    assert (o_chunk - o_ref).abs().max().item() < 1e-10
    assert (s_chunk - s_ref).abs().max().item() < 1e-10


def test_split_prefill_carries_state() -> None:
    q, k, v, g, beta, s0 = make_inputs(83, seed=1)
    s_one, s_two = s0.clone(), s0.clone()
    one = chunk_gated_delta_rule(q, k, v, g, beta, s_one)
    parts = [chunk_gated_delta_rule(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], s_two)
             for a, b in ((0, 30), (30, 31), (31, 83))]
    assert (torch.cat(parts) - one).abs().max().item() < 1e-10
    assert (s_two - s_one).abs().max().item() < 1e-10


def test_matches_transformers_reference() -> None:
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_recurrent_gated_delta_rule

    gen = torch.Generator().manual_seed(2)
    q_raw, k_raw = torch.randn(2, 23, HK, DK, generator=gen)
    v = torch.randn(23, HV, DV, generator=gen)
    g = -torch.rand(23, HV, generator=gen) * 3
    beta = torch.rand(23, HV, generator=gen)
    s0 = torch.randn(HV, DK, DV, generator=gen) * 0.1
    ref, ref_state = torch_recurrent_gated_delta_rule(
        q_raw[None], k_raw[None], v[None], g=g[None], beta=beta[None], initial_state=s0[None].clone(),
        output_final_state=True, use_qk_l2norm_in_kernel=True,
    )
    state = s0.clone()
    out = chunk_gated_delta_rule(l2_normalize(q_raw, DK**-0.5), l2_normalize(k_raw), v, g, beta, state)
    assert (out - ref[0]).abs().max().item() < 1e-5
    assert (state - ref_state[0]).abs().max().item() < 1e-5


def test_causal_conv_prefill_decode_and_reference() -> None:
    gen = torch.Generator().manual_seed(3)
    channels, kernel, t = 5, 4, 11
    x = torch.randn(t, channels, generator=gen, dtype=torch.float64)
    w = torch.randn(channels, kernel, generator=gen, dtype=torch.float64)
    ref = F.conv1d(x.t()[None], w[:, None], padding=kernel - 1, groups=channels)[0, :, :t].t()
    state = torch.zeros(channels, kernel - 1, dtype=torch.float64)
    one_shot = causal_conv1d(x, w, state)
    step_state = torch.zeros_like(state)
    steps = torch.cat([causal_conv1d(x[i : i + 1], w, step_state) for i in range(t)])
    split_state = torch.zeros_like(state)
    split = torch.cat([causal_conv1d(x[:2], w, split_state), causal_conv1d(x[2:], w, split_state)])
    for y in (one_shot, steps, split):
        assert (y - ref).abs().max().item() < 1e-12
    assert torch.equal(state, x[-(kernel - 1):].t())
    assert torch.equal(step_state, state) and torch.equal(split_state, state)
