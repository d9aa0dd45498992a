"""Plain-torch fp32 reference of :func:`freetoken.ops.moe_block.moe_block_decode`."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from freetoken.ops.cpu_moe.reference import cpu_moe_reference


def moe_block_decode_reference(h, norm, eps, router, gate_up, down, shared_gate_up, shared_down,
                               top_k: int, norm_topk_prob: bool
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Same arguments and results as the kernel, in fp32 from the upcast inputs: ``(h + block(h)
    [B, H] fp32, topk_ids [B, k] int64)``."""
    b, e = h.shape[0], gate_up.shape[0]
    hf = h.float()
    x = F.rms_norm(hf, (hf.shape[1],), norm.float(), eps)
    logits = x @ router.float().t()
    probs = torch.softmax(logits[:, :e], dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    out = cpu_moe_reference(x, torch.arange(b).repeat_interleave(top_k), ids.flatten(),
                            weights.flatten(), gate_up.float(), down.float())
    if shared_gate_up is not None:
        gate, up = (x @ shared_gate_up.float().t()).chunk(2, dim=-1)
        y = (F.silu(gate) * up) @ shared_down.float().t()
        out = out + torch.sigmoid(logits[:, e:]) * y
    return hf + out, ids
