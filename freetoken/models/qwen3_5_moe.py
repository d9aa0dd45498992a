"""Qwen3.5 / Qwen3.6 MoE (``Qwen3_5MoeForConditionalGeneration``, model_type ``qwen3_5_moe``).

Source: transformers ``modular_qwen3_5_moe.py`` and model-architectures.md §1.3-1.4: the Qwen3-Next
hybrid with four plain Gated DeltaNet input projections, every layer MoE with renormalised top-k,
and the text model of a multimodal release (``text_config``; the checkpoint's
``model.language_model.`` prefix and fused expert tensors are mapped by ``loader.Checkpoint``,
the vision tower is not served). Text positions make its interleaved M-RoPE plain 1-D RoPE.
"""

from __future__ import annotations

import torch
from torch import nn

from freetoken.models.attention import Attention
from freetoken.models.gated_deltanet import GatedDeltaNet
from freetoken.models.qwen3_next import Qwen3NextForCausalLM


class Qwen3_5MoeForCausalLM(Qwen3NextForCausalLM):
    """Qwen3.5-MoE decoder (see :class:`~freetoken.models.decoder.DecoderLM` for the interface)."""

    def build_mixer(self, layer: int, dtype: torch.dtype, device) -> nn.Module:
        """Gated DeltaNet (split projections) for ``linear_attention`` layers, gated attention
        otherwise."""
        if self.config.layer_types[layer] == "linear_attention":
            return GatedDeltaNet(self.config, dtype, device, split_projections=True)
        return Attention(self.config, gated=True, dtype=dtype, device=device)
