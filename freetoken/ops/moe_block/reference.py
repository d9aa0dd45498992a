"""Plain-torch fp32 reference of :func:`freetoken.ops.moe_block.moe_block_decode`."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from freetoken.ops.cpu_moe.reference import cpu_moe_reference


def moe_block_decode_reference(h, norm, eps, router, gate_up, down, shared_gate_up, shared_down,
                               top_k: int, norm_topk_prob: bool, score_bias=None,
                               n_group: int = 1, topk_group: int = 1,
                               routed_scaling: float = 1.0, router_bias=None, gate_up_bias=None,
                               down_bias=None, swiglu_limit: float | None = None,
                               swiglu_alpha: float = 1.702) -> tuple[torch.Tensor, torch.Tensor]:
    """Same arguments and results as the kernel, in fp32 from the upcast inputs: ``(h + block(h)
    [B, H] fp32, topk_ids [B, k] int64)``. Sigmoid routing (``score_bias`` given) follows
    transformers ``Glm4MoeTopkRouter``, biased top-k routing (``router_bias``)
    ``GptOssTopKRouter``, the expert biases and clamp ``GptOssExperts``."""
    b, e = h.shape[0], gate_up.shape[0]
    hf = h.float()
    x = F.rms_norm(hf, (hf.shape[1],), norm.float(), eps)
    logits = x @ router.float().t()
    if router_bias is not None:
        top, ids = torch.topk(logits + router_bias.float(), top_k, dim=-1)
        weights = torch.softmax(top, dim=-1)
    elif score_bias is not None:
        scores = torch.sigmoid(logits)
        choice = scores + score_bias.float()
        per = e // n_group
        best_two = choice.view(b, n_group, per).topk(2, dim=-1).values.sum(-1)
        keep = torch.zeros_like(best_two, dtype=torch.bool)
        keep.scatter_(1, torch.topk(best_two, topk_group, dim=-1).indices, True)
        choice = choice.masked_fill(~keep.repeat_interleave(per, dim=1), float("-inf"))
        ids = torch.topk(choice, top_k, dim=-1).indices
        weights = scores.gather(1, ids)
        if norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        weights = weights * routed_scaling
    else:
        probs = torch.softmax(logits[:, :e], dim=-1)
        weights, ids = torch.topk(probs, top_k, dim=-1)
        if norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
    out = cpu_moe_reference(x, torch.arange(b).repeat_interleave(top_k), ids.flatten(),
                            weights.flatten(), gate_up.float(), down.float(),
                            gate_up_bias=gate_up_bias, down_bias=down_bias,
                            swiglu_limit=swiglu_limit, swiglu_alpha=swiglu_alpha)
    if shared_gate_up is not None:
        gate, up = (x @ shared_gate_up.float().t()).chunk(2, dim=-1)
        y = (F.silu(gate) * up) @ shared_down.float().t()
        out = out + (y if score_bias is not None else torch.sigmoid(logits[:, e:]) * y)
    return hf + out, ids
