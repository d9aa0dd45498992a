"""A :class:`~freetoken.models.decoder.DecoderLM` decode step as one C++ call.

:func:`build_decode_stack` turns the model's layers into a
:class:`~freetoken.ops.decode_stack.DecodeStack` when every layer fits the C++ decode ops (CPU,
fp32 / bf16 weights, a sparse MoE block with resident experts (dense, or a bank set read as
stored) or a dense MLP in every layer;
gpt-oss's sinks, windows and biases included);
:func:`run_decode_stack` runs one step of paged sequences through it and applies the effects the
per-layer path has on the Python side (KV lengths, token counts, routing observers).
"""

from __future__ import annotations

import torch

from freetoken.models.attention import Attention
from freetoken.models.gated_deltanet import GatedDeltaNet
from freetoken.models.moe import DenseMLP, SparseMoE
from freetoken.models.norms import RMSNorm
from freetoken.models.paged import PagedDecodeBatch
from freetoken.models.state import HybridState
from freetoken.ops.decode_stack import AttentionLayer, DecodeStack, GdnLayer, MoeLayer
from freetoken.ops.linear import KERNEL_MAX_ROWS, cpu_kernel_fits

_EMPTY = torch.empty(0)


def _mixer_spec(mixer, norm, pool_layer: int) -> AttentionLayer | GdnLayer:
    if isinstance(mixer, GatedDeltaNet):
        return GdnLayer(mixer.in_weight, mixer.conv_weight, mixer.dt_bias, mixer.A_log,
                        mixer.norm_weight, mixer.out_weight, mixer.hk, mixer.hv, mixer.eps,
                        norm.scale(), norm.eps)
    norms = mixer.q_norm is not None
    return AttentionLayer(mixer.qkv_weight, mixer.o_weight,
                          mixer.q_norm.scale() if norms else None,
                          mixer.k_norm.scale() if norms else None, mixer.nh, mixer.nkv,
                          mixer.gated, mixer.q_norm.eps if norms else 1e-6, mixer.scale,
                          norm.scale(), norm.eps, pool_layer,
                          None if mixer.qkv_bias is None else mixer.qkv_bias.float(),
                          **mixer.decode_extras())


def _moe_spec(mlp: SparseMoE | DenseMLP, norm, probe: torch.Tensor) -> MoeLayer:
    if isinstance(mlp, DenseMLP):
        return MoeLayer(norm.scale(), norm.eps, *mlp.block_weights(), None, None, 1, True)
    shared = (mlp.shared.gate_up, mlp.shared.down) if mlp.has_shared else (None, None)
    return MoeLayer(norm=norm.scale(), eps=norm.eps, router=mlp.router,
                    shared_gate_up=shared[0], shared_down=shared[1], top_k=mlp.top_k,
                    norm_topk_prob=mlp.norm_topk_prob, **mlp.block_kwargs(probe))


def copied_parameters(model) -> list[torch.Tensor]:
    """The parameters a stack holds copies of rather than reading them where they lie: every
    norm's weight (the stack takes the fp32 multiplier) and the q/k/v, o_proj and router biases
    not stored in fp32 (the stack takes them as fp32). A stack built before one of them changed
    in place is stale."""
    copied = [m.weight for m in model.modules() if isinstance(m, RMSNorm)]
    for layer in model.layers:
        for owner, name in ((layer.mixer, "qkv_bias"), (layer.mixer, "o_bias"),
                            (layer.mlp, "router_bias")):
            bias = getattr(owner, name, None)
            if bias is not None and bias.dtype != torch.float32:
                copied.append(bias)
    return copied


def decode_layer_specs(model) -> list[tuple[AttentionLayer | GdnLayer, MoeLayer]] | None:
    """Per decoder layer the ``(mixer, moe)`` op arguments a :class:`DecodeStack` takes (each
    op callable alone with them: ``freetoken.ops.attention_decode``, ``gdn_decode``,
    ``moe_block``), or None when a layer does not fit (offloaded experts, weights off the CPU
    or not one fp32 / bf16 dtype)."""
    probe = model.embed[:1]
    if not cpu_kernel_fits(probe, model.embed, model.lm_head):
        return None
    layers, pool_layer = [], 0
    for layer in model.layers:
        mixer, mlp = layer.mixer, layer.mlp
        if not isinstance(mlp, (SparseMoE, DenseMLP)) or not mlp.fused_fits(probe):
            return None
        if isinstance(mixer, GatedDeltaNet):
            if not mixer.decode_fits(probe):
                return None
        elif not isinstance(mixer, Attention) or not mixer.paged_decode_fits(probe):
            return None
        layers.append((_mixer_spec(mixer, layer.input_norm, pool_layer),
                       _moe_spec(mlp, layer.post_norm, probe)))
        pool_layer += isinstance(mixer, Attention)
    return layers


def build_decode_stack(model) -> DecodeStack | None:
    """The model's decode step as a :class:`DecodeStack`, or None when a layer does not fit
    (:func:`decode_layer_specs`). The stack reads the parameters' storage: build a new one after
    replacing a parameter tensor."""
    layers = decode_layer_specs(model)
    if layers is None:
        return None
    return DecodeStack(model.embed, model.norm.scale(), model.norm.eps, model.lm_head, layers)


def run_decode_stack(model, stack: DecodeStack, ids: torch.Tensor,
                     states: list[HybridState]) -> torch.Tensor | None:
    """One decode step of ``B = len(states)`` sequences (``ids [B]`` int64, their new tokens)
    through ``stack``; None, with nothing changed, when the step does not fit it (more than
    ``KERNEL_MAX_ROWS`` sequences, or attention states not all ``PagedKV`` of one pool).

    Returns:
        ``[B, V]`` fp32 logits; each state's KV lengths and ``num_tokens`` grow by one and every
        MoE block's routing observer sees its top-k ids, as on the per-layer path.
    """
    if ids.shape[0] > KERNEL_MAX_ROWS:
        return None
    plan = model.decode_plan()
    attn = plan.attention
    pool_k = pool_v = None
    cos = sin = kv_slots = kv_offsets = _EMPTY
    if attn:
        first = [s.layers[attn[0]] for s in states]
        batch = PagedDecodeBatch.of_layer(first, [s.num_tokens for s in states], model.rotary)
        if batch is None:
            return None
        cos, sin, kv_slots, kv_offsets = batch.cos, batch.sin, batch.kv_slots, batch.kv_offsets
        pool_k, pool_v = first[0].pool.k, first[0].pool.v
    gdn = stack.gdn_layers
    conv = [[s.layers[i].conv for s in states] for i in gdn]
    recurrent = [[s.layers[i].recurrent for s in states] for i in gdn]
    logits, topk = stack.run(ids, cos, sin, pool_k, pool_v, kv_slots, kv_offsets, conv,
                             recurrent)
    for s in states:
        for i in attn:
            s.layers[i].length += 1
        s.num_tokens += 1
    for block, row in plan.moe_rows:
        if block.routing_observer is not None:
            block.routing_observer(block.moe_layer, topk[row])
    return logits
