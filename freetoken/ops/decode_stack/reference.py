"""Plain-torch fp32 reference of :class:`freetoken.ops.decode_stack.DecodeStack`: the layers'
own references (attention, Gated DeltaNet, MoE block) in order, with the embedding, the final
RMSNorm and the lm_head around them (transformers ``Qwen3MoeModel`` / ``Qwen3NextModel`` /
``GptOssModel``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from freetoken.ops.attention_decode.reference import paged_decode_attention_reference
from freetoken.ops.gdn_decode.reference import gdn_decode_reference
from freetoken.ops.moe_block.reference import moe_block_decode_reference


def decode_stack_reference(embed, final_norm, final_eps, lm_head, layers, token_ids, cos, sin,
                           pool_k, pool_v, kv_slots, kv_offsets, conv_states, recurrent
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Same arguments (the :class:`DecodeStack` constructor's, then :meth:`DecodeStack.run`'s)
    and effects as the kernel, in fp32 from the upcast inputs. Returns ``(logits [B, V] fp32,
    topk_ids [layers, B, k] int64)``."""
    from freetoken.ops.decode_stack import AttentionLayer

    h = embed.float()[token_ids]
    ids, gdn = [], 0
    for mixer, moe in layers:
        if isinstance(mixer, AttentionLayer):
            j = mixer.pool_layer
            h = paged_decode_attention_reference(
                h, mixer.qkv_w, mixer.o_w, mixer.q_norm, mixer.k_norm, cos, sin, pool_k[j],
                pool_v[j], kv_slots, kv_offsets, mixer.num_heads, mixer.num_kv_heads,
                mixer.gated, mixer.eps, mixer.scale, mixer.input_norm, mixer.input_eps,
                qkv_bias=mixer.qkv_bias, sinks=mixer.sinks, window=mixer.window,
                o_bias=mixer.o_bias)
        else:
            h = gdn_decode_reference(
                h, mixer.in_w, mixer.conv_w, mixer.dt_bias, mixer.a_log, mixer.norm_w,
                mixer.out_w, conv_states[gdn], recurrent[gdn], mixer.num_k_heads,
                mixer.num_v_heads, mixer.eps, mixer.input_norm, mixer.input_eps)
            gdn += 1
        h, topk = moe_block_decode_reference(h, moe.norm, moe.eps, moe.router, moe.gate_up,
                                             moe.down, moe.shared_gate_up, moe.shared_down,
                                             moe.top_k, moe.norm_topk_prob, moe.score_bias,
                                             moe.n_group, moe.topk_group, moe.routed_scaling,
                                             moe.router_bias, moe.gate_up_bias, moe.down_bias,
                                             moe.swiglu_limit, moe.swiglu_alpha)
        ids.append(topk)
    k = max(t.shape[1] for t in ids)  # a block with a smaller top_k fills the first values
    rows = [torch.cat([t.flatten(), t.new_zeros(t.shape[0] * (k - t.shape[1]))]).view(-1, k)
            for t in ids]
    x = F.rms_norm(h, (h.shape[1],), final_norm.float(), final_eps)
    return x @ lm_head.float().t(), torch.stack(rows)
