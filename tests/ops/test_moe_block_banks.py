"""The C++ decode MoE block over bank sets read as stored (mxfp4, q4g, fp8, nvfp4, and dense
tuples) against the fp32 reference on the dequantised weights, on every ISA variant this CPU
supports; q8 activations against the fp32 block; clear errors."""

from __future__ import annotations

import pytest
import torch

from freetoken.ops.cpu_moe import Q8_TOLERANCE, relative_rms_error
from freetoken.ops.cpu_moe.cpu import supported_isas
from freetoken.ops.cpu_moe.formats import build_banks
from freetoken.ops.moe_block import (
    BF16_TOLERANCE,
    MOE_BLOCK_TOLERANCE,
    bank_kwargs,
    moe_block_decode,
)
from freetoken.ops.moe_block.reference import moe_block_decode_reference

ISAS = supported_isas()
FORMATS = ("mxfp4", "q4g", "fp8", "nvfp4", "bf16", "fp32")
# (tokens, hidden, experts, intermediate, top-k, shared intermediate or 0); 4-bit formats need
# H and I multiples of 32
SHAPES = [
    (1, 256, 16, 128, 4, 0),    # tiny gpt_oss-like
    (3, 128, 12, 96, 3, 64),    # shared expert, three tokens
    (2, 96, 5, 64, 5, 0),       # every expert routed, odd expert count
]


def _case(shape, fmt, dtype, seed, gpt_oss=False):
    b, h, e, i, k, shared = shape
    g = torch.Generator().manual_seed(seed)
    rows = e + (1 if shared else 0)
    gate_up = torch.randn(e, 2 * i, h, generator=g) / h**0.5
    down = torch.randn(e, h, i, generator=g) / i**0.5
    view = build_banks(gate_up, down, fmt, block_size=(32, 64))
    dense_gu, dense_dn = view.dequantize()
    base = dict(h=torch.randn(b, h, generator=g).to(dtype),
                norm=torch.rand(h, generator=g) + 0.5, eps=1e-6,
                # gpt-oss keeps its biased logits in bf16: half the scale keeps the softmax
                # weights' rounding inside the bf16 tolerance
                router=((2 if gpt_oss else 4) * torch.randn(rows, h, generator=g)
                        / h**0.5).to(dtype))
    shared_w = dict(
        shared_gate_up=(torch.randn(2 * shared, h, generator=g) / h**0.5).to(dtype)
        if shared else None,
        shared_down=(torch.randn(h, shared, generator=g) / max(shared, 1)**0.5).to(dtype)
        if shared else None)
    config = dict(top_k=k, norm_topk_prob=True)
    if gpt_oss:
        config.update(router_bias=torch.randn(e, generator=g).to(dtype).float(),
                      gate_up_bias=torch.randn(e, 2 * i, generator=g),
                      down_bias=torch.randn(e, h, generator=g), swiglu_limit=7.0)
    kernel = dict(base, **shared_w, **config, **bank_kwargs(view))
    reference = dict(base, gate_up=dense_gu, down=dense_dn, **shared_w, **config)
    return kernel, reference


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"T{s[0]}-H{s[1]}-E{s[2]}-I{s[3]}")
def test_banks_match_the_reference_on_their_dequantised_weights(isa, fmt, shape):
    kernel, reference = _case(shape, fmt, torch.float32, seed=sum(shape))
    if fmt == "bf16":  # dense bf16 banks in an fp32 model are refused (one dtype): fp32 h only
        kernel["expert_format"] = "bf16"
    out, ids = moe_block_decode(**kernel, isa=isa)
    ref, ref_ids = moe_block_decode_reference(**reference)
    assert torch.equal(ids, ref_ids)
    h = kernel["h"].float()
    assert relative_rms_error(ref - h, out - h) <= MOE_BLOCK_TOLERANCE


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4", "fp8"])
def test_gpt_oss_experts_from_banks_in_a_bf16_model(isa, fmt):
    """bf16 residual stream, router and routing; MXFP4 / NVFP4 / FP8 experts with biases and the
    clamp: h + block rounded to bf16 as the torch block keeps it."""
    kernel, reference = _case(SHAPES[0], fmt, torch.bfloat16, seed=5, gpt_oss=True)
    out, ids = moe_block_decode(**kernel, isa=isa)
    ref, ref_ids = moe_block_decode_reference(**reference)
    assert torch.equal(ids, ref_ids)
    assert relative_rms_error(ref, out) <= BF16_TOLERANCE


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", ["mxfp4", "q4g"])
def test_q8_activations_stay_within_their_tolerance(isa, fmt):
    kernel, reference = _case(SHAPES[1], fmt, torch.float32, seed=9)
    exact, _ = moe_block_decode(**kernel, isa=isa)
    q8, ids = moe_block_decode(**{**kernel, "activations": "q8"}, isa=isa)
    _, ref_ids = moe_block_decode_reference(**reference)
    assert torch.equal(ids, ref_ids)  # routing never sees the activation mode
    h = kernel["h"].float()
    error = relative_rms_error(exact - h, q8 - h)
    assert 0 < error <= Q8_TOLERANCE  # > 0: the int8 path really ran


def test_bank_arguments_are_clear_errors():
    kernel, _ = _case(SHAPES[2], "mxfp4", torch.float32, seed=1)
    with pytest.raises(ValueError, match="^gate_up must be a tuple of the bank's tensors with "
                                         "expert_format 'mxfp4'"):
        moe_block_decode(**{**kernel, "gate_up": kernel["gate_up"][0]})
    with pytest.raises(ValueError, match=r"^mxfp4 down takes \(blocks, scales\), got 1 tensors"):
        moe_block_decode(**{**kernel, "down": kernel["down"][:1]})
    with pytest.raises(ValueError, match=r"^gate_up \[5, 128, 96\] / down \[5, 32, 32\] must be "
                                         r"\[E, 2I, 96\] / \[E, 96, I\]$"):
        small = build_banks(torch.zeros(5, 64, 32), torch.zeros(5, 32, 32), "mxfp4")
        moe_block_decode(**{**kernel, "down": small.down})
    with pytest.raises(ValueError, match="^activations='bf16' needs bf16 or fp8 expert banks, "
                                         "got mxfp4"):
        moe_block_decode(**{**kernel, "activations": "bf16"})
    fp8, _ = _case(SHAPES[2], "fp8", torch.float32, seed=1)
    with pytest.raises(ValueError, match="^activations='q8' is not supported with fp8 expert "
                                         r"banks \(they take activations='fp32' or 'bf16'\)"):
        moe_block_decode(**{**fp8, "activations": "q8"})
    with pytest.raises(ValueError, match=r"^fp8 expert banks need block_size \(bm, bn\)"):
        moe_block_decode(**{**fp8, "block_size": None})
    dense, _ = _case(SHAPES[2], "fp32", torch.float32, seed=1)
    with pytest.raises(ValueError, match="^activations='q8' needs 4-bit expert banks "
                                         r"\(mxfp4 or q4g\), got fp32"):
        moe_block_decode(**{**dense, "activations": "q8"})
    with pytest.raises(ValueError, match="^block_size applies to fp8 expert banks only"):
        moe_block_decode(**{**dense, "gate_up": dense["gate_up"][0], "down": dense["down"][0],
                            "expert_format": None, "block_size": (1, 1)})
