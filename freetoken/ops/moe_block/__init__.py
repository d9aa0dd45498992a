"""A whole sparse MoE block at decode on the CPU, one C++ call per layer and step.

:func:`moe_block_decode` runs ``h + MoE(RMSNorm(h))`` for ``B`` tokens with resident experts,
dense in the model dtype or a bank set in any kernel format read as stored (mxfp4, q4g, fp8,
nvfp4; :func:`bank_kwargs`) (``csrc/src/moe_block.cpp``): the post-attention norm, the router, softmax top-k routing
(or GLM's sigmoid group routing, or gpt-oss's biased top-k), the routed experts (the expert
kernel, each routed expert's weights streamed once, with gpt-oss's biases and clamped SwiGLU
when given), the shared expert of Qwen3-Next / GLM and the residual add, with no torch op in
between.
fp32 inputs match :func:`~freetoken.ops.moe_block.reference.moe_block_decode_reference` within
:data:`MOE_BLOCK_TOLERANCE` (fp32 summation order) with the same routing; with bf16 inputs every
value the torch block keeps in bf16 is rounded where it does, within :data:`BF16_TOLERANCE`.
"""

from __future__ import annotations

import torch

from freetoken.ops.cpu_moe import _ext
from freetoken.ops.cpu_moe.formats import ExpertBankView

MOE_BLOCK_TOLERANCE = 1e-5  # relative RMS of the block output against the fp32 reference
BF16_TOLERANCE = 1e-2  # relative RMS of h + block (rounded to bf16), bf16 inputs, same routing


def bank_kwargs(view: ExpertBankView, activations: str = "fp32") -> dict:
    """The routed-expert keywords of :func:`moe_block_decode` (and fields of the decode stack's
    ``MoeLayer``) for a bank set read as stored: ``gate_up`` / ``down`` tuples, ``expert_format``,
    fp8's ``block_size`` and the kernel's ``activations`` (``fp32``; ``q8`` with mxfp4 / q4g
    banks; ``bf16`` with bf16 banks)."""
    return {"gate_up": view.gate_up, "down": view.down, "expert_format": view.format,
            "block_size": view.block_size, "activations": activations}


def moe_block_decode(h: torch.Tensor, norm: torch.Tensor, eps: float, router: torch.Tensor,
                     gate_up: torch.Tensor | tuple[torch.Tensor, ...],
                     down: torch.Tensor | tuple[torch.Tensor, ...],
                     shared_gate_up: torch.Tensor | None, shared_down: torch.Tensor | None, *,
                     top_k: int, norm_topk_prob: bool, isa: str | None = None,
                     score_bias: torch.Tensor | None = None, n_group: int = 1,
                     topk_group: int = 1, routed_scaling: float = 1.0,
                     router_bias: torch.Tensor | None = None,
                     gate_up_bias: torch.Tensor | None = None,
                     down_bias: torch.Tensor | None = None, swiglu_limit: float | None = None,
                     swiglu_alpha: float = 1.702, expert_format: str | None = None,
                     block_size: tuple[int, int] | None = None,
                     activations: str = "fp32") -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step of a sparse MoE block.

    Args:
        h: ``[B, H]`` residual stream, fp32 or bf16 (the model dtype; every weight the same).
        norm: ``[H]`` fp32 RMSNorm multiplier; eps: its epsilon.
        router: ``[E, H]``, or ``[E + 1, H]`` with the shared expert's gate row last.
        gate_up, down: ``[E, 2I, H]`` / ``[E, H, I]`` routed experts (gate rows first) in the
            model dtype, or with ``expert_format`` the tuples of a bank set in that format
            (``freetoken.ops.cpu_moe.formats``; fp8 with ``block_size``): see
            :func:`bank_kwargs`.
        shared_gate_up, shared_down: ``[2Is, H]`` / ``[H, Is]`` shared expert, or both None.
        top_k: experts per token; norm_topk_prob: renormalise their probabilities.
        isa: kernel variant (``freetoken.ops.cpu_moe.cpu.supported_isas``).
        score_bias: ``[E]`` fp32 ``e_score_correction_bias``: sigmoid group routing (GLM-4.5,
            ``freetoken.models.moe_sigmoid``) with ``n_group`` / ``topk_group`` groups and
            ``routed_scaling``; the router is then fp32 ``[E, H]`` (logits unrounded) and the
            shared expert ungated. None: softmax routing.
        router_bias: ``[E]`` fp32 (holding model-dtype values): gpt-oss routing
            (``freetoken.models.moe_gpt_oss``): the biased logits (rounded to the model dtype),
            their top ``top_k``, softmax over those k (``norm_topk_prob`` unused); no shared
            expert, no ``score_bias``.
        gate_up_bias, down_bias, swiglu_limit, swiglu_alpha: gpt-oss's expert biases
            (``[E, 2I]`` / ``[E, H]`` fp32) and clamped SwiGLU, as
            :func:`~freetoken.ops.cpu_moe.cpu.cpu_moe` takes them.
        activations: what the expert kernel multiplies the banks with (``fp32``; ``q8``: int8
            blocks, mxfp4 / q4g banks only; ``bf16``: bf16 banks only); the router and the
            shared expert are unaffected.

    Returns:
        ``(out [B, H] fp32 = h + block(h), topk_ids [B, k] int64, probability descending)``.

    Raises:
        TypeError / ValueError: a wrong dtype, device, shape or layout, ``top_k`` outside
            ``[1, E]``, ``router_bias`` with ``score_bias`` or a shared expert, a
            ``swiglu_limit`` / ``swiglu_alpha`` the expert kernel refuses, bank tensors the
            kernel refuses (messages as :func:`~freetoken.ops.cpu_moe.cpu.submit_banks`), or
            ``activations`` the banks do not take.
    """
    return _ext.moe_block_decode(h, norm, eps, router, gate_up, down, shared_gate_up,
                                 shared_down, top_k, norm_topk_prob, isa=isa,
                                 score_bias=score_bias, n_group=n_group, topk_group=topk_group,
                                 routed_scaling=routed_scaling, router_bias=router_bias,
                                 gate_up_bias=gate_up_bias, down_bias=down_bias,
                                 swiglu_limit=swiglu_limit, swiglu_alpha=swiglu_alpha,
                                 expert_format=expert_format, block_size=block_size,
                                 activations=activations)
