"""Decode attention over the paged KV pool on the CPU, one C++ call per layer and step.

:func:`paged_decode_attention` runs a whole attention layer for ``B`` sequences of one new token
each (``csrc/src/attention.cpp``): the fused q/k/v projection and ``o_proj`` on the ``rows_dot``
kernels (plus optional q/k/v and o_proj biases), q/k RMSNorm (optional) and RoPE, the new K/V
written into the pool, and attention that reads each sequence's K/V rows where they lie in the
pool (no gather copy per step, so its cost grows with the context only by the bytes it must
read), optionally with gpt-oss's per-head sinks and a sliding window. fp32 inputs match
:func:`~freetoken.ops.attention_decode.reference.paged_decode_attention_reference` within
:data:`ATTENTION_TOLERANCE` (fp32 summation order); with bf16 inputs every value the torch layer
keeps in bf16 is rounded where it does, within :data:`BF16_TOLERANCE` of that fp32 reference.
"""

from __future__ import annotations

import torch

from freetoken.ops.cpu_moe import _ext

ATTENTION_TOLERANCE = 1e-5  # relative RMS against the fp32 reference, fp32 inputs
BF16_TOLERANCE = 1e-2  # relative RMS against the fp32 reference on the same bf16 inputs


def paged_decode_attention(x: torch.Tensor, qkv_w: torch.Tensor, o_w: torch.Tensor,
                           q_norm: torch.Tensor, k_norm: torch.Tensor, cos: torch.Tensor,
                           sin: torch.Tensor, pool_k: torch.Tensor, pool_v: torch.Tensor,
                           kv_slots: torch.Tensor, kv_offsets: torch.Tensor, *, num_heads: int,
                           num_kv_heads: int, gated: bool, eps: float, scale: float,
                           input_norm: torch.Tensor | None = None, input_eps: float = 1e-6,
                           isa: str | None = None,
                           qkv_bias: torch.Tensor | None = None,
                           sinks: torch.Tensor | None = None, window: int = 0,
                           o_bias: torch.Tensor | None = None) -> torch.Tensor:
    """One decode step of a GQA attention layer for ``B`` sequences.

    Args:
        x: ``[B, H]`` normed hidden states, fp32 or bf16 (the model dtype).
        qkv_w: ``[q_rows + 2 * nkv * hd, H]`` fused q/k/v weight, rows ``[q | gate | k | v]``
            (``q_rows = nh * hd``, twice that with ``gated``); ``o_w``: ``[H, nh * hd]``.
        q_norm, k_norm: ``[hd]`` fp32 RMSNorm multipliers, or both None (no q/k norm, GLM;
            ``hd`` then follows from ``qkv_w``'s rows).
        cos, sin: ``[B, rot / 2]`` fp32 RoPE tables at each sequence's new position.
        pool_k, pool_v: ``[slots, nkv, hd]`` this layer's pool rows (the model dtype); the new
            token's K/V are written at each sequence's last slot.
        kv_slots: ``[N]`` int64, the sequences' slots in position order, concatenated (the new
            token's slot last); ``kv_offsets``: ``[B + 1]`` int64 boundaries into it.
        num_heads, num_kv_heads: nh, nkv. gated: Qwen3-Next output gate. eps: RMSNorm epsilon.
        scale: softmax scale.
        input_norm: ``[H]`` fp32 multiplier of the layer's input RMSNorm (epsilon
            ``input_eps``), or None. Given, ``x`` is the residual stream ``h`` and the result is
            ``h + o_proj(...)`` of ``RMSNorm(h)`` (the add in the model dtype).
        isa: kernel variant (``freetoken.ops.cpu_moe.cpu.supported_isas``).
        qkv_bias: ``[rows]`` fp32 (holding model-dtype values) added to the q/k/v projection
            before the norms (GLM, gpt-oss), the sum rounded to the model dtype; or None.
        sinks: ``[nh]`` fp32 sink logit of each query head (gpt-oss): one more softmax column
            that takes probability and contributes no value; or None.
        window: > 0: each sequence attends to its last ``min(n, window)`` slots only (its new
            token's included, the ``sliding_attention`` layers of gpt-oss); 0: to all of them.
        o_bias: ``[H]`` fp32 (holding model-dtype values) added to ``o_proj``'s output
            (rounded to the model dtype first, the sum rounded before the residual add);
            or None.

    Returns:
        ``[B, H]`` fp32 ``o_proj`` output (with ``o_bias``; or ``h`` plus it).

    Raises:
        TypeError / ValueError: a wrong dtype, device, shape or layout, offsets that are not
            non-decreasing, a sequence without a slot, a slot outside the pool, or a negative
            ``window``.
    """
    return _ext.attention_decode(x, qkv_w, o_w, q_norm, k_norm, cos, sin, pool_k, pool_v,
                                 kv_slots, kv_offsets, num_heads, num_kv_heads, gated, eps,
                                 scale, input_norm, input_eps, isa=isa, qkv_bias=qkv_bias,
                                 sinks=sinks, window=window, o_bias=o_bias)
