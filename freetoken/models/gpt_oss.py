"""gpt-oss-20b / 120b (``GptOssForCausalLM``, model_type ``gpt_oss``).

Source: transformers ``modeling_gpt_oss.py`` and model-architectures.md §4: every layer is
attention (:class:`~freetoken.models.gpt_oss_attention.GptOssAttention`: sinks, q/k/v/o biases,
YaRN RoPE, a 128-key window on the ``sliding_attention`` layers) and a MoE block
(:class:`~freetoken.models.moe_gpt_oss.GptOssMoE`: biased top-k router, biased experts with the
clamped SwiGLU); ``w * rms(x)`` norms, no shared expert, no dense layers.
"""

from __future__ import annotations

import torch
from torch import nn

from freetoken.models.decoder import DecoderLM
from freetoken.models.gpt_oss_attention import GptOssAttention
from freetoken.models.moe_gpt_oss import GptOssMoE


class GptOssForCausalLM(DecoderLM):
    """gpt-oss decoder (see :class:`~freetoken.models.decoder.DecoderLM` for the interface)."""

    moe_class = GptOssMoE

    def build_mixer(self, layer: int, dtype: torch.dtype, device) -> nn.Module:
        """Attention with sinks; windowed on ``sliding_attention`` layers."""
        sliding = self.config.layer_types[layer] == "sliding_attention"
        return GptOssAttention(self.config, self.config.sliding_window if sliding else 0,
                               dtype=dtype, device=device)
