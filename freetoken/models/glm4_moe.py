"""GLM-4.5 / 4.6 / 4.7 and the Air variants (``Glm4MoeForCausalLM``, model_type ``glm4_moe``).

Source: transformers ``modeling_glm4_moe.py`` and model-architectures.md §5.6: GQA attention
with q/k/v biases, optional per-head q/k RMSNorm (``use_qk_norm``) and NeoX RoPE on the first
``partial_rotary_factor`` (0.5) of each head; plain ``w * rms(x)`` norms; dense SwiGLU for the
first ``first_k_dense_replace`` layers, then sigmoid-routed MoE with shared experts
(:class:`~freetoken.models.moe_sigmoid.SigmoidRoutedMoE`). The MTP layer the releases store as
``model.layers.{L}`` is not loaded.
"""

from __future__ import annotations

import torch
from torch import nn

from freetoken.models.attention import Attention
from freetoken.models.decoder import DecoderLM
from freetoken.models.moe_sigmoid import SigmoidRoutedMoE


class Glm4MoeForCausalLM(DecoderLM):
    """GLM-4.5 decoder (see :class:`~freetoken.models.decoder.DecoderLM` for the interface)."""

    moe_class = SigmoidRoutedMoE

    def build_mixer(self, layer: int, dtype: torch.dtype, device) -> nn.Module:
        """Plain (ungated) GQA attention for every layer."""
        return Attention(self.config, gated=False, dtype=dtype, device=device)
