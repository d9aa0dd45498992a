"""The C++ decode MoE block (``freetoken.ops.moe_block``) against its fp32 reference on every ISA
variant this CPU supports: routing, output, the shared expert, and clear errors."""

from __future__ import annotations

import pytest
import torch

from freetoken.ops.cpu_moe import relative_rms_error
from freetoken.ops.cpu_moe.cpu import supported_isas
from freetoken.ops.moe_block import BF16_TOLERANCE, MOE_BLOCK_TOLERANCE, moe_block_decode
from freetoken.ops.moe_block.reference import moe_block_decode_reference

ISAS = supported_isas()
# (tokens, hidden, experts, intermediate, top-k, shared intermediate or 0, norm_topk_prob)
SHAPES = [
    (1, 1024, 64, 256, 8, 0, True),     # small qwen3_moe preset
    (3, 1024, 64, 256, 8, 256, True),   # small qwen3_next preset (shared expert)
    (2, 72, 10, 40, 3, 24, False),      # odd sizes, no renormalisation
    (5, 64, 5, 37, 5, 0, True),         # every expert routed
]


def _case(shape, dtype, seed):
    b, h, e, i, k, shared, norm_topk = shape
    g = torch.Generator().manual_seed(seed)
    rows = e + (1 if shared else 0)
    t = dict(
        h=torch.randn(b, h, generator=g).to(dtype),
        norm=torch.rand(h, generator=g) + 0.5, eps=1e-6,
        # router rows scaled so the top-k margins exceed bf16 rounding of the logits
        router=(4 * torch.randn(rows, h, generator=g) / h**0.5).to(dtype),
        gate_up=(torch.randn(e, 2 * i, h, generator=g) / h**0.5).to(dtype),
        down=(torch.randn(e, h, i, generator=g) / i**0.5).to(dtype),
        shared_gate_up=(torch.randn(2 * shared, h, generator=g) / h**0.5).to(dtype)
        if shared else None,
        shared_down=(torch.randn(h, shared, generator=g) / max(shared, 1) ** 0.5).to(dtype)
        if shared else None,
    )
    return t, dict(top_k=k, norm_topk_prob=norm_topk)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"T{s[0]}-H{s[1]}-E{s[2]}-I{s[3]}-k{s[4]}")
def test_matches_reference(isa, dtype, shape):
    tensors, config = _case(shape, dtype, seed=sum(shape[:5]))
    out, ids = moe_block_decode(*tensors.values(), **config, isa=isa)
    ref, ref_ids = moe_block_decode_reference(*tensors.values(), **config)
    assert out.shape == ref.shape and out.dtype == torch.float32
    assert ids.dtype == torch.int64 and torch.equal(ids, ref_ids)
    if dtype == torch.float32:  # the block's own contribution (the residual would hide it)
        h = tensors["h"].float()
        assert relative_rms_error(ref - h, out - h) <= MOE_BLOCK_TOLERANCE
    else:  # h + block rounded to bf16, as the model's residual stream is
        assert relative_rms_error(ref, out) <= BF16_TOLERANCE


def test_bad_arguments_are_clear_errors():
    tensors, config = _case(SHAPES[2], torch.float32, seed=1)
    args = list(tensors.values())

    def call(index, value, **change):
        a = list(args)
        a[index] = value
        return moe_block_decode(*a, **{**config, **change})

    with pytest.raises(TypeError, match="^router must be float32, got bfloat16"):
        call(3, args[3].bfloat16())
    with pytest.raises(ValueError, match=r"^router \[10, 72\] must be \[11, 72\]"):
        call(3, args[3][:10].contiguous())
    with pytest.raises(ValueError, match="^shared_gate_up and shared_down go together"):
        call(7, None)
    with pytest.raises(ValueError, match=r"^top_k 11 outside \[1, 10\]"):
        call(0, args[0], top_k=11)
    with pytest.raises(ValueError, match=r"^norm must be \[72\]"):
        call(1, torch.ones(71))


# (tokens, hidden, experts, intermediate, top-k, shared, norm_topk_prob, n_group, topk_group,
#  routed_scaling): GLM-4.5's sigmoid group routing
SIGMOID_SHAPES = [
    (1, 1024, 64, 256, 8, 256, True, 1, 1, 1.0),   # small glm4_moe preset
    (3, 72, 12, 40, 3, 24, True, 4, 2, 2.5),       # groups, scaling, odd sizes
    (2, 64, 8, 37, 4, 0, False, 2, 1, 1.8),        # one group of two kept, no renormalisation
]


def _sigmoid_case(shape, dtype, seed):
    b, h, e, i, k, shared, norm_topk, groups, chosen, scaling = shape
    tensors, config = _case((b, h, e, i, k, shared, norm_topk), dtype, seed)
    g = torch.Generator().manual_seed(seed + 1)
    tensors["router"] = 4 * torch.randn(e, h, generator=g) / h**0.5  # fp32, E rows
    bias = torch.randn(e, generator=g) * 0.5
    return tensors, dict(config, score_bias=bias, n_group=groups, topk_group=chosen,
                         routed_scaling=scaling)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", SIGMOID_SHAPES, ids=lambda s: f"T{s[0]}-E{s[2]}-g{s[7]}")
def test_sigmoid_group_routing_matches_reference(isa, dtype, shape):
    tensors, config = _sigmoid_case(shape, dtype, seed=sum(shape[:5]))
    out, ids = moe_block_decode(*tensors.values(), **config, isa=isa)
    ref, ref_ids = moe_block_decode_reference(*tensors.values(), **config)
    assert torch.equal(ids, ref_ids)
    per, chosen = shape[2] // shape[7], shape[8]
    assert all(len({int(i) // per for i in row}) <= chosen for row in ids)  # groups respected
    if dtype == torch.float32:
        h = tensors["h"].float()
        assert relative_rms_error(ref - h, out - h) <= MOE_BLOCK_TOLERANCE
    else:
        assert relative_rms_error(ref, out) <= BF16_TOLERANCE
    rescaled, _ = moe_block_decode(*tensors.values(),
                                   **{**config, "routed_scaling": 2 * shape[9]}, isa=isa)
    assert relative_rms_error(ref, rescaled) > 10 * MOE_BLOCK_TOLERANCE  # the scaling is applied


def test_sigmoid_routing_arguments_are_checked():
    tensors, config = _sigmoid_case(SIGMOID_SHAPES[1], torch.float32, seed=2)
    with pytest.raises(ValueError, match=r"^n_group 5 / topk_group 2 do not fit 12 experts"):
        moe_block_decode(*tensors.values(), **{**config, "n_group": 5})
    with pytest.raises(ValueError, match=r"^score_bias must be \[12\]"):
        moe_block_decode(*tensors.values(), **{**config, "score_bias": torch.zeros(3)})
    with pytest.raises(TypeError, match="^router must be float32, got bfloat16"):
        moe_block_decode(*{**tensors, "router": tensors["router"].bfloat16()}.values(), **config)


# (tokens, hidden, experts, intermediate, top-k): gpt-oss's biased top-k routing, biased experts
# and clamped SwiGLU
GPT_OSS_SHAPES = [
    (1, 1024, 64, 512, 4),   # small gpt_oss preset
    (3, 256, 16, 128, 4),    # tiny preset
    (2, 72, 10, 40, 3),      # odd sizes
    (5, 64, 5, 37, 5),       # every expert routed
]


def _gpt_oss_case(shape, dtype, seed):
    b, h, e, i, k = shape
    tensors, config = _case((b, h, e, i, k, 0, True), dtype, seed)
    g = torch.Generator().manual_seed(seed + 2)
    # gate_up scaled so that ~40% of g / u pass the limit of 7 and the clamp matters; router
    # logits at half the scale above: the biased logits are kept in bf16, whose spacing (2^-4
    # from 8 up) would move the softmax weights by more than the bf16 tolerance at 4x
    tensors["gate_up"] = (8 * torch.randn(e, 2 * i, h, generator=g) / h**0.5).to(dtype)
    tensors["router"] = (2 * torch.randn(e, h, generator=g) / h**0.5).to(dtype)
    return tensors, dict(config, router_bias=torch.randn(e, generator=g).to(dtype).float(),
                         gate_up_bias=torch.randn(e, 2 * i, generator=g),
                         down_bias=torch.randn(e, h, generator=g), swiglu_limit=7.0,
                         swiglu_alpha=1.702)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", GPT_OSS_SHAPES, ids=lambda s: f"T{s[0]}-H{s[1]}-E{s[2]}-k{s[4]}")
def test_gpt_oss_routing_and_experts_match_reference(isa, dtype, shape):
    tensors, config = _gpt_oss_case(shape, dtype, seed=sum(shape) + 1)
    out, ids = moe_block_decode(*tensors.values(), **config, isa=isa)
    ref, ref_ids = moe_block_decode_reference(*tensors.values(), **config)
    assert torch.equal(ids, ref_ids)
    if dtype == torch.float32:
        h = tensors["h"].float()
        assert relative_rms_error(ref - h, out - h) <= MOE_BLOCK_TOLERANCE
        for change in ({"swiglu_limit": float("inf")}, {"gate_up_bias": None},
                       {"down_bias": None}):  # each part is applied
            other, _ = moe_block_decode(*tensors.values(), **{**config, **change}, isa=isa)
            assert relative_rms_error(ref - h, other - h) > 10 * MOE_BLOCK_TOLERANCE
    else:
        assert relative_rms_error(ref, out) <= BF16_TOLERANCE


@pytest.mark.parametrize("isa", ISAS)
def test_gpt_oss_router_bias_picks_the_experts(isa):
    """A large bias on some experts makes them the top-k, in bias order, whatever the logits;
    their weights are the softmax of the biased logits over those k alone."""
    tensors, config = _gpt_oss_case(GPT_OSS_SHAPES[2], torch.float32, seed=3)
    bias = torch.zeros(10)
    bias[[7, 2, 5]] = torch.tensor([300.0, 200.0, 100.0])
    out, ids = moe_block_decode(*tensors.values(), **{**config, "router_bias": bias}, isa=isa)
    assert ids.tolist() == [[7, 2, 5]] * 2
    ref, _ = moe_block_decode_reference(*tensors.values(), **{**config, "router_bias": bias})
    h = tensors["h"].float()
    assert relative_rms_error(ref - h, out - h) <= MOE_BLOCK_TOLERANCE


def test_gpt_oss_arguments_are_checked():
    tensors, config = _gpt_oss_case(GPT_OSS_SHAPES[2], torch.float32, seed=1)
    with pytest.raises(ValueError, match=r"^router_bias \[3\] must be \[10\]"):
        moe_block_decode(*tensors.values(), **{**config, "router_bias": torch.zeros(3)})
    with pytest.raises(ValueError, match="^router_bias and score_bias select two routings"):
        moe_block_decode(*tensors.values(), **{**config, "score_bias": torch.zeros(10)})
    shared = dict(tensors, shared_gate_up=torch.zeros(8, 72), shared_down=torch.zeros(72, 4))
    with pytest.raises(ValueError, match=r"^router_bias \(gpt-oss routing\) takes no shared"):
        moe_block_decode(*shared.values(), **config)
    with pytest.raises(ValueError, match="^swiglu_limit must be > 0"):
        moe_block_decode(*tensors.values(), **{**config, "swiglu_limit": 0.0})
    with pytest.raises(ValueError, match=r"^down_bias \[10, 71\] does not match"):
        moe_block_decode(*tensors.values(), **{**config, "down_bias": torch.zeros(10, 71)})
