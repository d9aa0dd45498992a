"""The whole-step C++ decode (``freetoken.ops.decode_stack``) against its fp32 reference and
against the per-layer C++ decode ops called one by one (the same residual stream, K/V and
recurrent states bit for bit), on every ISA variant this CPU supports, and its errors (nothing
changed on bad input)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from freetoken.ops.attention_decode import paged_decode_attention
from freetoken.ops.cpu_moe import relative_rms_error
from freetoken.ops.cpu_moe.cpu import supported_isas
from freetoken.ops.decode_stack import (BF16_TOLERANCE, STACK_TOLERANCE, AttentionLayer,
                                        DecodeStack, GdnLayer, MoeLayer)
from freetoken.ops.decode_stack.reference import decode_stack_reference
from freetoken.ops.gdn_decode import gdn_decode
from freetoken.ops.linear import kernel_linear
from freetoken.ops.moe_block import moe_block_decode

ISAS = supported_isas()
# (context lengths incl. the new token = B sequences, hidden, layers ("a" attention, "g" Gated
#  DeltaNet), (nh, nkv, hd, rot, gated), (Hk, Hv, dk, dv, K), (E, I, top-k, shared I), vocab)
SHAPES = [
    ((40,), 256, "aaa", (4, 2, 64, 64, False), None, (16, 64, 4, 0), 300),  # qwen3_moe-like
    ((7, 300, 1), 128, "gga", (2, 1, 64, 16, True), (2, 4, 16, 24, 4), (8, 48, 2, 32), 257),
    ((5, 2), 72, "ag", (3, 1, 40, 10, True), (1, 3, 20, 37, 3), (5, 37, 2, 24), 101),  # odd
    ((1, 1), 64, "gg", None, (2, 2, 16, 16, 4), (4, 32, 1, 0), 64),  # no attention layer
]


def _randn(g, *shape, scale=1.0, dtype=torch.float32):
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def _case(shape, dtype, seed):
    lengths, hidden, pattern, attn, gdn, moe, vocab = shape
    g = torch.Generator().manual_seed(seed)
    b = len(lengths)
    norm = lambda n: torch.rand(n, generator=g) + 0.5  # noqa: E731
    layers, conv, rec = [], [], []
    for kind in pattern:
        if kind == "a":
            nh, nkv, hd, rot, gated = attn
            rows = nh * hd * (2 if gated else 1) + 2 * nkv * hd
            mixer = AttentionLayer(
                _randn(g, rows, hidden, scale=hidden**-0.5, dtype=dtype),
                _randn(g, hidden, nh * hd, scale=(nh * hd) ** -0.5, dtype=dtype), norm(hd),
                norm(hd), nh, nkv, gated, 1e-6, hd**-0.5, norm(hidden), 1e-6,
                sum(m == "a" for m in pattern[: len(layers)]))
        else:
            hk, hv, dk, dv, k = gdn
            conv_dim = 2 * hk * dk + hv * dv
            mixer = GdnLayer(
                _randn(g, conv_dim + hv * dv + 2 * hv, hidden, scale=hidden**-0.5, dtype=dtype),
                _randn(g, conv_dim, k, scale=k**-0.5, dtype=dtype), _randn(g, hv),
                _randn(g, hv, scale=0.5), norm(dv),
                _randn(g, hidden, hv * dv, scale=(hv * dv) ** -0.5, dtype=dtype), hk, hv, 1e-6,
                norm(hidden), 1e-6)
            conv.append([_randn(g, conv_dim, k - 1, dtype=dtype) for _ in range(b)])
            rec.append([_randn(g, hv, dk, dv, scale=0.1) for _ in range(b)])
        e, i, top_k, shared = moe
        layers.append((mixer, MoeLayer(
            norm(hidden), 1e-6, _randn(g, e + (1 if shared else 0), hidden,
                                       scale=4 * hidden**-0.5, dtype=dtype),
            _randn(g, e, 2 * i, hidden, scale=hidden**-0.5, dtype=dtype),
            _randn(g, e, hidden, i, scale=i**-0.5, dtype=dtype),
            _randn(g, 2 * shared, hidden, scale=hidden**-0.5, dtype=dtype) if shared else None,
            _randn(g, hidden, shared, scale=max(shared, 1) ** -0.5, dtype=dtype)
            if shared else None, top_k, True)))
    weights = dict(embed=_randn(g, vocab + 3, hidden, dtype=dtype), final_norm=norm(hidden),
                   final_eps=1e-6, lm_head=_randn(g, vocab, hidden, scale=hidden**-0.5,
                                                  dtype=dtype), layers=layers)
    step = dict(token_ids=torch.randint(0, vocab + 3, (b,), generator=g), conv_states=conv,
                recurrent=rec, pool_k=None, pool_v=None, cos=torch.empty(0),
                sin=torch.empty(0), kv_slots=torch.empty(0, dtype=torch.int64),
                kv_offsets=torch.empty(0, dtype=torch.int64))
    if attn is not None:
        nh, nkv, hd, rot, gated = attn
        pool_layers = pattern.count("a")
        slots = 2 * sum(lengths) + 3
        inv_freq = 1.0 / (1e6 ** (torch.arange(0, rot, 2).float() / rot))
        angles = torch.tensor([n - 1 for n in lengths]).float()[:, None] * inv_freq[None]
        step.update(
            pool_k=_randn(g, pool_layers, slots, nkv, hd, dtype=dtype),
            pool_v=_randn(g, pool_layers, slots, nkv, hd, dtype=dtype),
            cos=angles.cos(), sin=angles.sin(),
            kv_slots=torch.randperm(slots, generator=g)[: sum(lengths)],
            kv_offsets=torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()]))
    return weights, step


def _clone_step(step):
    out = {}
    for k, v in step.items():
        if isinstance(v, list):
            out[k] = [[t.clone() for t in per_layer] for per_layer in v]
        else:
            out[k] = v.clone() if isinstance(v, torch.Tensor) else v
    return out


def _states(step):
    tensors = [t for k in ("pool_k", "pool_v") if step[k] is not None for t in [step[k]]]
    return tensors + [t for k in ("conv_states", "recurrent") for lay in step[k] for t in lay]


def _layer_by_layer(weights, step, isa):
    """The per-layer C++ ops called one by one (the residual stream kept in the model dtype),
    then the final norm and lm_head in torch / the linear kernel."""
    dtype = weights["embed"].dtype
    h = weights["embed"][step["token_ids"]]
    ids, gdn = [], 0
    for mixer, moe in weights["layers"]:
        if isinstance(mixer, AttentionLayer):
            j = mixer.pool_layer
            out = paged_decode_attention(
                h, mixer.qkv_w, mixer.o_w, mixer.q_norm, mixer.k_norm, step["cos"], step["sin"],
                step["pool_k"][j], step["pool_v"][j], step["kv_slots"], step["kv_offsets"],
                num_heads=mixer.num_heads, num_kv_heads=mixer.num_kv_heads, gated=mixer.gated,
                eps=mixer.eps, scale=mixer.scale, input_norm=mixer.input_norm,
                input_eps=mixer.input_eps, isa=isa, qkv_bias=mixer.qkv_bias, sinks=mixer.sinks,
                window=mixer.window, o_bias=mixer.o_bias)
        else:
            out = gdn_decode(h, mixer.in_w, mixer.conv_w, mixer.dt_bias, mixer.a_log,
                             mixer.norm_w, mixer.out_w, step["conv_states"][gdn],
                             step["recurrent"][gdn], num_k_heads=mixer.num_k_heads,
                             num_v_heads=mixer.num_v_heads, eps=mixer.eps,
                             input_norm=mixer.input_norm, input_eps=mixer.input_eps, isa=isa)
            gdn += 1
        out, topk = moe_block_decode(out.to(dtype), moe.norm, moe.eps, moe.router, moe.gate_up,
                                     moe.down, moe.shared_gate_up, moe.shared_down,
                                     top_k=moe.top_k, norm_topk_prob=moe.norm_topk_prob,
                                     isa=isa, score_bias=moe.score_bias, n_group=moe.n_group,
                                     topk_group=moe.topk_group,
                                     routed_scaling=moe.routed_scaling,
                                     router_bias=moe.router_bias, gate_up_bias=moe.gate_up_bias,
                                     down_bias=moe.down_bias, swiglu_limit=moe.swiglu_limit,
                                     swiglu_alpha=moe.swiglu_alpha)
        h = out.to(dtype)
        ids.append(topk)
    x = F.rms_norm(h.float(), (h.shape[1],), weights["final_norm"], weights["final_eps"])
    logits = kernel_linear(x.to(dtype), weights["lm_head"], isa=isa).to(dtype).float()
    k = max(t.shape[1] for t in ids)  # a dense block's single id column is zero-padded
    return logits, torch.stack([F.pad(t, (0, k - t.shape[1])) for t in ids])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"B{len(s[0])}-H{s[1]}-{s[2]}")
def test_equals_the_layer_ops_and_matches_reference(isa, dtype, shape):
    weights, step = _case(shape, dtype, seed=shape[1] + len(shape[2]))
    by_layer_step, ref_step = _clone_step(step), _clone_step(step)
    logits, topk = DecodeStack(**weights, isa=isa).run(**step)
    want_logits, want_topk = _layer_by_layer(weights, by_layer_step, isa)
    b, layers = len(shape[0]), len(shape[2])
    assert logits.shape == (b, shape[-1]) and logits.dtype == torch.float32
    assert topk.shape == (layers, b, shape[5][2]) and torch.equal(topk, want_topk)
    for got, want in zip(_states(step), _states(by_layer_step)):
        assert torch.equal(got, want)  # the same ops on the same residual stream
    # only the final norm's summation order differs from the torch one
    assert relative_rms_error(want_logits, logits) <= (1e-6 if dtype == torch.float32 else 4e-3)
    ref_logits, ref_topk = decode_stack_reference(**weights, **ref_step)
    if dtype == torch.float32:
        assert torch.equal(topk, ref_topk)
        assert relative_rms_error(ref_logits, logits) <= STACK_TOLERANCE
        for got, want in zip(_states(step), _states(ref_step)):
            assert relative_rms_error(want, got) <= STACK_TOLERANCE
    else:  # a near-tie may route differently after bf16 rounding: the logits stay close
        assert relative_rms_error(ref_logits, logits) <= BF16_TOLERANCE


def test_bad_step_input_is_a_clear_error_and_changes_nothing():
    weights, step = _case(SHAPES[1], torch.float32, seed=3)
    stack = DecodeStack(**weights)
    before = [t.clone() for t in _states(step)]
    bad = dict(step, token_ids=torch.tensor([0, 1, 260]))
    with pytest.raises(ValueError, match="^decode_stack: token id 260 outside the embedding's "
                                         "260 rows$"):
        stack.run(**bad)
    slots = step["kv_slots"].clone()
    slots[-1] = 10_000
    with pytest.raises(ValueError, match=r"^decode_stack: KV slot 10000 outside the pool's 619$"):
        stack.run(**dict(step, kv_slots=slots))
    offsets = step["kv_offsets"].clone()
    offsets[2] = offsets[1]
    with pytest.raises(ValueError, match="^decode_stack: sequence 1 has no slot for its new"):
        stack.run(**dict(step, kv_offsets=offsets))
    for got, want in zip(_states(step), before):
        assert torch.equal(got, want)
    with pytest.raises(ValueError, match=r"^conv_states and recurrent need one list per Gated "
                                         r"DeltaNet layer \(2\)$"):
        stack.run(**dict(step, conv_states=step["conv_states"][:1]))
    with pytest.raises(ValueError, match=r"^layer 1: sequence 2: conv state \[96, 2\]"):
        conv = [step["conv_states"][0], [*step["conv_states"][1][:2], torch.zeros(96, 2)]]
        stack.run(**dict(step, conv_states=conv))
    pool = torch.zeros(1, 619, 1, 32)
    with pytest.raises(ValueError, match=r"^pool_k \[1, 619, 1, 32\] / pool_v \[1, 619, 1, 32\] "
                                         r"must both be \[>= 1, slots, 1, 64\]$"):
        stack.run(**dict(step, pool_k=pool, pool_v=pool))


def test_bad_weights_name_the_layer():
    weights, _ = _case(SHAPES[2], torch.float32, seed=5)
    mixer, moe = weights["layers"][1]
    bad = MoeLayer(moe.norm, moe.eps, moe.router[:-1], moe.gate_up, moe.down,
                   moe.shared_gate_up, moe.shared_down, moe.top_k, moe.norm_topk_prob)
    with pytest.raises(ValueError, match=r"^layer 1: router \[5, 72\] must be \[6, 72\]$"):
        DecodeStack(**dict(weights, layers=[weights["layers"][0], (mixer, bad)]))
    with pytest.raises(TypeError, match="^layer 0: qkv_w must be float32, got bfloat16$"):
        attn, moe0 = weights["layers"][0]
        wrong = AttentionLayer(attn.qkv_w.bfloat16(), *list(vars(attn).values())[1:])
        DecodeStack(**dict(weights, layers=[(wrong, moe0)]))
    with pytest.raises(ValueError, match=r"^final_norm must be \[72\]$"):
        DecodeStack(**dict(weights, final_norm=torch.ones(5)))
    with pytest.raises(ValueError, match="^a decode stack needs at least one layer$"):
        DecodeStack(**dict(weights, layers=[]))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_glm_layers_equal_the_layer_ops_and_match_reference(isa, dtype):
    """GLM-4.5's layer forms: q/k/v biases without q/k norms, a dense first layer (one expert,
    top_k 1), sigmoid group routing with routed scaling and ungated shared experts."""
    weights, step = _case(SHAPES[0], dtype, seed=11)
    g = torch.Generator().manual_seed(12)
    layers = []
    for j, (mixer, moe) in enumerate(weights["layers"]):
        bias = _randn(g, mixer.qkv_w.shape[0], scale=0.5, dtype=dtype).float()
        mixer = dataclasses.replace(mixer, q_norm=None, k_norm=None, qkv_bias=bias)
        e, hidden = moe.gate_up.shape[0], moe.gate_up.shape[2]
        if j == 0:  # dense SwiGLU as one expert
            moe = dataclasses.replace(moe, router=torch.zeros(1, hidden, dtype=dtype),
                                      gate_up=moe.gate_up[:1].contiguous(),
                                      down=moe.down[:1].contiguous(), top_k=1)
        else:
            moe = dataclasses.replace(
                moe, router=_randn(g, e, hidden, scale=4 * hidden**-0.5),
                shared_gate_up=_randn(g, 64, hidden, scale=hidden**-0.5, dtype=dtype),
                shared_down=_randn(g, hidden, 32, scale=32**-0.5, dtype=dtype),
                score_bias=_randn(g, e, scale=0.5), n_group=4, topk_group=2, routed_scaling=2.5)
        layers.append((mixer, moe))
    weights["layers"] = layers
    by_layer_step, ref_step = _clone_step(step), _clone_step(step)
    logits, topk = DecodeStack(**weights, isa=isa).run(**step)
    want_logits, want_topk = _layer_by_layer(weights, by_layer_step, isa)
    assert torch.equal(topk[1:], want_topk[1:])  # the MoE layers (the dense one routes to 0)
    for got, want in zip(_states(step), _states(by_layer_step)):
        assert torch.equal(got, want)
    assert relative_rms_error(want_logits, logits) <= (1e-6 if dtype == torch.float32 else 4e-3)
    ref_logits, ref_topk = decode_stack_reference(**weights, **ref_step)
    if dtype == torch.float32:
        assert torch.equal(topk[1:], ref_topk[1:])
        assert relative_rms_error(ref_logits, logits) <= STACK_TOLERANCE
    else:
        assert relative_rms_error(ref_logits, logits) <= BF16_TOLERANCE



@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gpt_oss_layers_equal_the_layer_ops_and_match_reference(isa, dtype):
    """gpt-oss's layer forms: q/k/v and o_proj biases without q/k norms, sinks, a 32-slot window
    on every other layer (contexts shorter and longer than it), biased top-k routing and
    biased experts with the clamped SwiGLU."""
    shape = ((40, 7, 300), 256, "aaa", (4, 2, 64, 64, False), None, (16, 64, 4, 0), 300)
    weights, step = _case(shape, dtype, seed=13)
    g = torch.Generator().manual_seed(14)
    layers = []
    for j, (mixer, moe) in enumerate(weights["layers"]):
        hidden, (e, two_i, _) = mixer.o_w.shape[0], moe.gate_up.shape
        mixer = dataclasses.replace(
            mixer, q_norm=None, k_norm=None,
            qkv_bias=_randn(g, mixer.qkv_w.shape[0], scale=0.5, dtype=dtype).float(),
            sinks=_randn(g, mixer.num_heads) + 3, window=32 if j % 2 == 0 else 0,
            o_bias=_randn(g, hidden, dtype=dtype).float())
        moe = dataclasses.replace(
            moe, router=_randn(g, e, hidden, scale=2 * hidden**-0.5, dtype=dtype),
            # g / u past the limit of 7 for a share of them; down scaled back so the experts'
            # output stays near the residual stream's scale
            gate_up=_randn(g, e, two_i, hidden, scale=8 * hidden**-0.5, dtype=dtype),
            down=(moe.down.float() / 8).to(dtype),
            router_bias=_randn(g, e, dtype=dtype).float(), gate_up_bias=_randn(g, e, two_i),
            down_bias=_randn(g, e, hidden), swiglu_limit=7.0)
        layers.append((mixer, moe))
    weights["layers"] = layers
    by_layer_step, ref_step = _clone_step(step), _clone_step(step)
    logits, topk = DecodeStack(**weights, isa=isa).run(**step)
    want_logits, want_topk = _layer_by_layer(weights, by_layer_step, isa)
    assert torch.equal(topk, want_topk)
    for got, want in zip(_states(step), _states(by_layer_step)):
        assert torch.equal(got, want)
    assert relative_rms_error(want_logits, logits) <= (1e-6 if dtype == torch.float32 else 4e-3)
    ref_logits, ref_topk = decode_stack_reference(**weights, **ref_step)
    if dtype == torch.float32:
        assert torch.equal(topk, ref_topk)
        assert relative_rms_error(ref_logits, logits) <= STACK_TOLERANCE
    else:
        assert relative_rms_error(ref_logits, logits) <= BF16_TOLERANCE
