"""Qwen3-MoE (``Qwen3MoeForCausalLM``, model_type ``qwen3_moe``).

Source: transformers ``modeling_qwen3_moe.py`` and model-architectures.md §3: every layer is
GQA attention with per-head q/k RMSNorm and full-dim RoPE (no output gate), plain ``w * rms(x)``
norms, softmax top-k MoE without a shared expert (dense SwiGLU on ``mlp_only_layers``).
"""

from __future__ import annotations

import torch
from torch import nn

from freetoken.models.attention import Attention
from freetoken.models.decoder import DecoderLM


class Qwen3MoeForCausalLM(DecoderLM):
    """Qwen3-MoE decoder (see :class:`~freetoken.models.decoder.DecoderLM` for the interface)."""

    def build_mixer(self, layer: int, dtype: torch.dtype, device) -> nn.Module:
        """Plain GQA attention for every layer."""
        return Attention(self.config, gated=False, dtype=dtype, device=device)
