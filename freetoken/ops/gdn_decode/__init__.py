"""Gated DeltaNet decode on the CPU, one C++ call per layer and step.

:func:`gdn_decode` runs a whole Gated DeltaNet layer (Qwen3-Next linear attention) for ``B``
sequences of one new token each (``csrc/src/gdn.cpp``): in_proj and out_proj on the ``rows_dot``
kernels, the short causal conv with its state shifted in place, L2-normalised q / k, the gates,
the gated delta rule on each value head's fp32 state (the ISA variants of
``csrc/src/decode_impl.h``) and the gated RMSNorm. fp32 inputs match
:func:`~freetoken.ops.gdn_decode.reference.gdn_decode_reference` within :data:`GDN_TOLERANCE`
(fp32 summation order); with bf16 inputs every value the torch layer keeps in bf16 is rounded
where it does, within :data:`BF16_TOLERANCE` of that fp32 reference.
"""

from __future__ import annotations

import torch

from freetoken.ops.cpu_moe import _ext

GDN_TOLERANCE = 1e-5  # relative RMS against the fp32 reference (output and states), fp32 inputs
BF16_TOLERANCE = 1e-2  # relative RMS of the output against the fp32 reference, bf16 inputs


def gdn_decode(x: torch.Tensor, in_w: torch.Tensor, conv_w: torch.Tensor,
               dt_bias: torch.Tensor, a_log: torch.Tensor, norm_w: torch.Tensor,
               out_w: torch.Tensor, conv_states: list[torch.Tensor],
               recurrent: list[torch.Tensor], *, num_k_heads: int, num_v_heads: int, eps: float,
               input_norm: torch.Tensor | None = None, input_eps: float = 1e-6,
               isa: str | None = None) -> torch.Tensor:
    """One decode step of a Gated DeltaNet layer for ``B`` sequences.

    Args:
        x: ``[B, H]`` normed hidden states, fp32 or bf16 (the model dtype, like every weight and
            conv state).
        in_w: ``[conv_dim + Hv*dv + 2*Hv, H]`` fused projection, rows ``[q | k | v | z | b | a]``
            (``conv_dim = 2*Hk*dk + Hv*dv``); conv_w: ``[conv_dim, K]`` depthwise taps.
        dt_bias, a_log: ``[Hv]`` fp32; norm_w: ``[dv]`` fp32 gated-RMSNorm weight; eps: its
            epsilon. out_w: ``[H, Hv*dv]``.
        conv_states: per sequence ``[conv_dim, K-1]`` (oldest input first), shifted in place.
        recurrent: per sequence ``[Hv, dk, dv]`` fp32 delta-rule state, updated in place.
        num_k_heads, num_v_heads: Hk, Hv.
        input_norm: ``[H]`` fp32 multiplier of the layer's input RMSNorm (epsilon
            ``input_eps``), or None. Given, ``x`` is the residual stream ``h`` and the result is
            ``h + out_proj(...)`` of ``RMSNorm(h)`` (the add in the model dtype).
        isa: kernel variant (``freetoken.ops.cpu_moe.cpu.supported_isas``).

    Returns:
        ``[B, H]`` fp32 ``out_proj`` output (or ``h`` plus it).

    Raises:
        TypeError / ValueError: a wrong dtype, device, shape or layout, or not one state per
            sequence.
    """
    return _ext.gdn_decode(x, in_w, conv_w, dt_bias, a_log, norm_w, out_w, conv_states,
                           recurrent, num_k_heads, num_v_heads, eps, input_norm, input_eps,
                           isa=isa)
