"""The gpt-oss keywords of the CPU expert kernel's entry points: argument errors (exact messages)
and the fp32 reference against transformers' ``GptOssExperts`` (the source of the math).
Shape letters: T tokens, H hidden, I expert intermediate, N flat expert ids, K top-k.
"""

from __future__ import annotations

import pytest
import torch

from freetoken.ops.cpu_moe import build_banks, cpu_moe_reference
from freetoken.ops.cpu_moe.cpu import cpu_moe, cpu_moe_banks, submit, submit_banks


def _args() -> dict:
    """A valid dense problem: N = 4 experts, H = 64, I = 32, two triples."""
    g = torch.Generator().manual_seed(0)
    return dict(x=torch.randn(2, 64, generator=g), token_ids=torch.tensor([0, 1]),
                expert_ids=torch.tensor([0, 3]), weights=torch.tensor([0.5, 0.5]),
                gate_up=torch.randn(4, 64, 64, generator=g).bfloat16(),
                down=torch.randn(4, 64, 32, generator=g).bfloat16())


def _submit_banks(**kw):
    a = _args()
    banks = build_banks(a.pop("gate_up").float(), a.pop("down").float(), "mxfp4")
    return submit_banks(**a, banks=banks, **kw)


def _submit(**kw):
    return submit(**_args(), **kw)


BIAS_ERRORS = [
    (dict(gate_up_bias=[[0.0] * 64] * 4), TypeError,
     "gate_up_bias must be a torch.Tensor, got list"),
    (dict(gate_up_bias=torch.zeros(4, 64).bfloat16()), TypeError,
     "gate_up_bias must be float32, got bfloat16"),
    (dict(down_bias=torch.zeros(4, 64, dtype=torch.float64)), TypeError,
     "down_bias must be float32, got float64"),
    (dict(gate_up_bias=torch.zeros(4, 63)), ValueError,
     "gate_up_bias [4, 63] does not match the expert banks: expected [N, 2I] = [4, 64]"),
    (dict(gate_up_bias=torch.zeros(3, 64)), ValueError,
     "gate_up_bias [3, 64] does not match the expert banks: expected [N, 2I] = [4, 64]"),
    (dict(down_bias=torch.zeros(4, 32)), ValueError,
     "down_bias [4, 32] does not match the expert banks: expected [N, H] = [4, 64]"),
    (dict(down_bias=torch.zeros(4 * 64)), ValueError,
     "down_bias must be 2-D [N, H], got shape [256]"),
    (dict(down_bias=torch.zeros(64, 4).t()), ValueError, "down_bias must be contiguous"),
    (dict(gate_up_bias=torch.zeros(4, 64, device="meta")), ValueError,
     "gate_up_bias must be a CPU tensor, got device meta"),
]
SCALAR_ERRORS = [
    (dict(swiglu_limit="7"), TypeError, "swiglu_limit must be a float or None, got str"),
    (dict(swiglu_limit=True), TypeError, "swiglu_limit must be a float or None, got bool"),
    (dict(swiglu_limit=7.0, swiglu_alpha=None), TypeError,
     "swiglu_alpha must be a float, got NoneType"),
    (dict(swiglu_limit=0.0), ValueError,
     "swiglu_limit must be > 0 (inf: the gpt-oss activation without a clamp; None: "
     "silu(g) * u), got 0.0"),
    (dict(swiglu_limit=-7), ValueError,
     "swiglu_limit must be > 0 (inf: the gpt-oss activation without a clamp; None: "
     "silu(g) * u), got -7.0"),
    (dict(swiglu_limit=1e-50), ValueError,  # 0 as a float
     "swiglu_limit must be > 0 (inf: the gpt-oss activation without a clamp; None: "
     "silu(g) * u), got 1e-50"),
    (dict(swiglu_limit=float("nan")), ValueError,
     "swiglu_limit must be > 0 (inf: the gpt-oss activation without a clamp; None: "
     "silu(g) * u), got nan"),
    (dict(swiglu_limit=7.0, swiglu_alpha=float("inf")), ValueError,
     "swiglu_alpha must be finite, got inf"),
    (dict(swiglu_alpha=1.0), ValueError,
     "swiglu_alpha applies only with swiglu_limit (the gpt-oss activation); got "
     "swiglu_alpha=1.0 with swiglu_limit=None"),
]


@pytest.mark.parametrize("entry", [_submit, _submit_banks], ids=["submit", "submit_banks"])
@pytest.mark.parametrize("change,exc_type,message", BIAS_ERRORS + SCALAR_ERRORS,
                         ids=lambda v: v if isinstance(v, str) else None)
def test_bad_gptoss_arguments(entry, change, exc_type, message):
    with pytest.raises(exc_type) as exc:
        entry(**change)
    assert str(exc.value) == message


def test_blocking_forms_take_the_keywords_and_accept_ints():
    a = _args()
    glu = dict(gate_up_bias=torch.randn(4, 64), down_bias=torch.randn(4, 64), swiglu_limit=7,
               swiglu_alpha=2)
    out = cpu_moe(**a, **glu)
    ref = cpu_moe_reference(*a.values(), **(glu | dict(swiglu_limit=7.0, swiglu_alpha=2.0)))
    assert (out - ref).abs().max() <= 1e-5 * ref.abs().max()
    banks = build_banks(a.pop("gate_up").float(), a.pop("down").float(), "bf16")
    assert torch.equal(cpu_moe_banks(**a, banks=banks, **glu), out)
    with pytest.raises(TypeError):  # keyword-only
        cpu_moe(*_args().values(), None, "fp32", glu["gate_up_bias"])


def _transformers_experts(gate_up, down, gate_up_bias, down_bias, limit, alpha):
    """transformers ``GptOssExperts`` holding our fp32 weights: its ``gate_up_proj [E, H, 2I]``
    interleaves gate (even columns) and up (odd), its matrices are [in, out]."""
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    n, two_i, h = gate_up.shape
    i = two_i // 2
    config = GptOssConfig(hidden_size=h, intermediate_size=i, num_local_experts=n,
                          num_experts_per_tok=3, swiglu_limit=limit, swiglu_alpha=alpha)
    config._experts_implementation = "eager"
    experts = GptOssExperts(config).float()
    gu = torch.empty(n, h, two_i)
    gu[:, :, 0::2] = gate_up[:, :i].transpose(1, 2)
    gu[:, :, 1::2] = gate_up[:, i:].transpose(1, 2)
    gub = torch.empty(n, two_i)
    gub[:, 0::2], gub[:, 1::2] = gate_up_bias[:, :i], gate_up_bias[:, i:]
    with torch.no_grad():
        experts.gate_up_proj.copy_(gu)
        experts.gate_up_proj_bias.copy_(gub)
        experts.down_proj.copy_(down.transpose(1, 2))  # [E, I, H]
        experts.down_proj_bias.copy_(down_bias)
    return experts


@pytest.mark.parametrize("t,h,i,n,k", [(1, 64, 32, 5, 3), (9, 96, 64, 7, 3), (33, 64, 96, 9, 5)])
def test_reference_equals_transformers_gptoss_experts(t, h, i, n, k):
    g = torch.Generator().manual_seed(t)
    gate_up = torch.randn(n, 2 * i, h, generator=g) * (3.5 / h**0.5)  # [N, 2I, H]
    down = torch.randn(n, h, i, generator=g) / i**0.5  # [N, H, I]
    gate_up_bias = torch.randn(n, 2 * i, generator=g) * 2.0
    down_bias = torch.randn(n, h, generator=g)
    x = torch.randn(t, h, generator=g)
    ids = torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(t)])  # [T, K]
    w = torch.rand(t, k, generator=g).softmax(-1)  # [T, K]
    experts = _transformers_experts(gate_up, down, gate_up_bias, down_bias, 7.0, 1.702)
    with torch.no_grad():
        want = experts(x, router_indices=ids, routing_weights=w)
    gu = torch.einsum("th,njh->tnj", x, gate_up) + gate_up_bias  # every (token, expert)
    assert (gu[..., :i] > 7).any() and (gu[..., i:].abs() > 7).any()  # the clamps bite
    got = cpu_moe_reference(x, torch.arange(t).repeat_interleave(k), ids.flatten(), w.flatten(),
                            gate_up, down, gate_up_bias=gate_up_bias, down_bias=down_bias,
                            swiglu_limit=7.0, swiglu_alpha=1.702)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert want.abs().max() > 1  # not a comparison of near-zeros
