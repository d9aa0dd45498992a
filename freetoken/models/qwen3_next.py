"""Qwen3-Next (``Qwen3NextForCausalLM``, model_type ``qwen3_next``).

Source: transformers ``modeling_qwen3_next.py`` and model-architectures.md §1: hybrid layers
(``layer_types``: Gated DeltaNet ``linear_attention`` and gated ``full_attention`` with partial
RoPE), zero-centred ``(1 + w)`` RMSNorms, softmax top-k MoE plus a sigmoid-gated shared expert.
"""

from __future__ import annotations

import torch
from torch import nn

from freetoken.models.attention import Attention
from freetoken.models.decoder import DecoderLM
from freetoken.models.gated_deltanet import GatedDeltaNet


class Qwen3NextForCausalLM(DecoderLM):
    """Qwen3-Next decoder (see :class:`~freetoken.models.decoder.DecoderLM` for the interface)."""

    def build_mixer(self, layer: int, dtype: torch.dtype, device) -> nn.Module:
        """Gated DeltaNet for ``linear_attention`` layers, gated attention otherwise."""
        if self.config.layer_types[layer] == "linear_attention":
            return GatedDeltaNet(self.config, dtype, device)
        return Attention(self.config, gated=True, dtype=dtype, device=device)
