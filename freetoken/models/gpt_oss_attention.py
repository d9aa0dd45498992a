"""gpt-oss attention: GQA with q/k/v/o biases, YaRN RoPE, learned sinks and sliding windows.

Source: transformers ``GptOssAttention`` / ``eager_attention_forward`` (model-architectures.md
§4.3). Each query head ``h`` has a sink logit ``s_h`` that joins its softmax as one more column
and is then dropped, so ``P = exp(scores) / (sum exp(scores) + exp(s_h))``. That equals plain
softmax attention times ``sigmoid(lse - s_h)`` (``lse`` the log-sum-exp of the scores), which is
how it is computed here: torch's CPU flash attention returns ``lse`` with the output. A
``sliding_attention`` layer lets position ``p`` see keys ``p - window < j <= p``; the cache keeps
every position (so prefix reuse stays exact) and each chunk reads only the window it needs.
A decode step over paged states runs the layer in one C++ call for every sequence
(:meth:`Attention.forward_paged_decode`, sinks, window and o_proj bias through
:meth:`decode_extras`).
"""

from __future__ import annotations

import torch
from torch import nn

from freetoken.models.attention import Attention, AttnContext
from freetoken.models.config import ModelConfig
from freetoken.models.loader import WeightTarget
from freetoken.models.rotary import apply_rotary
from freetoken.models.state import KVCache
from freetoken.ops.linear import linear

_flash_with_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


class GptOssAttention(Attention):
    """One gpt-oss attention layer.

    Args:
        config: model config (heads, head_dim, ``o_proj_bias``).
        window: keys a position sees, itself included (``sliding_window``), or 0 for full
            causal attention.
        dtype, device: parameter dtype/device; the sinks are kept in fp32.
    """

    def __init__(self, config: ModelConfig, window: int, dtype: torch.dtype, device=None) -> None:
        super().__init__(config, gated=False, dtype=dtype, device=device)
        self.window = window
        self.sinks = nn.Parameter(torch.empty(self.nh, device=device), requires_grad=False)
        self.o_bias = None
        if config.o_proj_bias:
            self.o_bias = nn.Parameter(torch.empty(config.hidden_size, dtype=dtype, device=device),
                                       requires_grad=False)

    def weight_targets(self, prefix: str) -> dict[str, WeightTarget]:
        """The q/k/v/o weights and biases and ``sinks`` under ``prefix``."""
        targets = super().weight_targets(prefix)
        targets[prefix + "sinks"] = WeightTarget(self.sinks)
        if self.o_bias is not None:
            targets[prefix + "o_proj.bias"] = WeightTarget(self.o_bias)
        return targets

    def decode_extras(self) -> dict:
        """The sinks, the window and the o_proj bias (fp32, holding model-dtype values) for the
        fused C++ decode attention, which adds the bias where :meth:`forward` does."""
        o_bias = None if self.o_bias is None else self.o_bias.float()
        return {"sinks": self.sinks, "window": self.window, "o_bias": o_bias}

    def forward(self, x: torch.Tensor, cache: KVCache, ctx: AttnContext) -> torch.Tensor:
        """Attend ``T`` new tokens (``x [T, H]``) to the visible cached ones; appends their K/V.

        Returns:
            ``[T, H]`` after ``o_proj`` (and its bias), in ``x``'s dtype.
        """
        t, nq = x.shape[0], self.nh * self.hd
        qkv = linear(x, self.qkv_weight)
        if self.qkv_bias is not None:
            qkv = qkv + self.qkv_bias
        q = qkv[:, :nq].view(t, self.nh, self.hd)
        k = qkv[:, nq : nq + self.kv_rows].view(t, self.nkv, self.hd)
        v = qkv[:, nq + self.kv_rows :].view(t, self.nkv, self.hd)
        q, k = apply_rotary(q, ctx.cos, ctx.sin), apply_rotary(k, ctx.cos, ctx.sin)
        keys, values = cache.append(k, v)  # [nkv, n, hd]
        n = keys.shape[1]
        start = n - t
        first = max(0, start - self.window + 1) if self.window else 0
        keys, values = keys[:, first:], values[:, first:]
        mask = self._mask(start, t, first, n, q.dtype, q.device)
        out, lse = _flash_with_lse(q.transpose(0, 1).unsqueeze(0), keys.unsqueeze(0),
                                   values.unsqueeze(0), 0.0, False, attn_mask=mask,
                                   scale=self.scale)
        keep = torch.sigmoid(lse[0] - self.sinks[:, None])  # [nh, T] fp32
        out = (out[0].float() * keep[..., None]).to(x.dtype).transpose(0, 1).reshape(t, nq)
        out = linear(out, self.o_weight)
        return out if self.o_bias is None else out + self.o_bias

    def _mask(self, start: int, t: int, first: int, n: int, dtype: torch.dtype,
              device) -> torch.Tensor | None:
        """Additive ``[T, n - first]`` mask: query ``i`` (position ``start + i``) sees key
        position ``j`` iff ``j <= start + i`` and, in a window, ``j > start + i - window``;
        None when every query sees every key."""
        if t == 1:
            return None
        pos = torch.arange(start, start + t, device=device)[:, None]
        key = torch.arange(first, n, device=device)[None, :]
        visible = key <= pos
        if self.window:
            visible &= key > pos - self.window
        return torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill_(
            ~visible, float("-inf"))
