"""Plain-torch fp32 reference of :func:`freetoken.ops.attention_decode.paged_decode_attention`.

Sources: transformers ``Qwen3MoeAttention`` / ``Qwen3NextAttention`` / ``Glm4MoeAttention`` /
``GptOssAttention`` at one new token per sequence (optional q/k/v bias, q/k RMSNorm over
head_dim when given, NeoX RoPE on the first ``rot`` dims, GQA softmax attention with gpt-oss's
optional sink column and sliding window, the Qwen3-Next ``sigmoid(gate)`` output gate,
``o_proj`` and its optional bias).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def paged_decode_attention_reference(x, qkv_w, o_w, q_norm, k_norm, cos, sin, pool_k, pool_v,
                                     kv_slots, kv_offsets, num_heads: int, num_kv_heads: int,
                                     gated: bool, eps: float, scale: float,
                                     input_norm: torch.Tensor | None = None,
                                     input_eps: float = 1e-6,
                                     qkv_bias: torch.Tensor | None = None,
                                     sinks: torch.Tensor | None = None, window: int = 0,
                                     o_bias: torch.Tensor | None = None) -> torch.Tensor:
    """Same arguments and effect as the kernel, computed in fp32 from the upcast inputs (the new
    K/V are written into ``pool_k`` / ``pool_v`` in their dtype, then read back like every
    other position). Returns ``[B, H]`` fp32."""
    if input_norm is not None:
        h = x.float()
        x = F.rms_norm(h, (h.shape[1],), input_norm.float(), input_eps)
        return h + paged_decode_attention_reference(x, qkv_w, o_w, q_norm, k_norm, cos, sin,
                                                    pool_k, pool_v, kv_slots, kv_offsets,
                                                    num_heads, num_kv_heads, gated, eps, scale,
                                                    qkv_bias=qkv_bias, sinks=sinks,
                                                    window=window, o_bias=o_bias)
    b, hd = x.shape[0], pool_k.shape[2]
    nq = num_heads * hd
    q_rows, kv_rows = nq * (2 if gated else 1), num_kv_heads * hd
    qkv = x.float() @ qkv_w.float().t()
    if qkv_bias is not None:
        qkv = qkv + qkv_bias.float()
    q = qkv[:, :nq].reshape(b, num_heads, hd)
    k = qkv[:, q_rows:q_rows + kv_rows].reshape(b, num_kv_heads, hd)
    if q_norm is not None:
        q = F.rms_norm(q, (hd,), q_norm.float(), eps)
        k = F.rms_norm(k, (hd,), k_norm.float(), eps)
    v = qkv[:, q_rows + kv_rows:].reshape(b, num_kv_heads, hd)
    half = cos.shape[1]

    def rotate(t: torch.Tensor) -> torch.Tensor:
        c, s = cos[:, None, :].float(), sin[:, None, :].float()
        t1, t2 = t[..., :half], t[..., half:2 * half]
        return torch.cat([t1 * c - t2 * s, t2 * c + t1 * s, t[..., 2 * half:]], dim=-1)

    q, k = rotate(q), rotate(k)
    group = num_heads // num_kv_heads
    rows = []
    for i in range(b):
        slots = kv_slots[int(kv_offsets[i]):int(kv_offsets[i + 1])]
        pool_k[slots[-1]] = k[i].to(pool_k.dtype)
        pool_v[slots[-1]] = v[i].to(pool_v.dtype)
        if window:
            slots = slots[-window:]
        keys = pool_k[slots].float().repeat_interleave(group, dim=1)  # [n, nh, hd]
        values = pool_v[slots].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[i], keys) * scale  # [nh, n]
        if sinks is not None:  # one more column per head, dropped after the softmax
            scores = torch.cat([scores, sinks.float()[:, None]], dim=1)
        probs = torch.softmax(scores, dim=-1)[:, :keys.shape[0]]
        rows.append(torch.einsum("hn,nhd->hd", probs, values).reshape(nq))
    out = torch.stack(rows)
    if gated:
        out = out * torch.sigmoid(qkv[:, nq:2 * nq])
    out = out @ o_w.float().t()
    return out if o_bias is None else out + o_bias.float()
