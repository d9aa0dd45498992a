"""A whole decode step on the CPU in one C++ call (``csrc/src/decode_stack.cpp``).

:class:`DecodeStack` holds a decoder's weights, checked once: per layer a mixer
(:class:`AttentionLayer` over the paged KV pool, or :class:`GdnLayer`) and a
:class:`MoeLayer`, then the final RMSNorm and the lm_head. :meth:`DecodeStack.run` takes ``B``
new token ids and returns their logits: the embedding, every layer through the same C++ decode
ops as :mod:`freetoken.ops.attention_decode`, :mod:`freetoken.ops.gdn_decode` and
:mod:`freetoken.ops.moe_block` (so the residual stream equals calling them one by one, bit for
bit), the final norm and the lm_head, with no Python between layers. fp32 inputs match
:func:`~freetoken.ops.decode_stack.reference.decode_stack_reference` within
:data:`STACK_TOLERANCE`; bf16 ones within :data:`BF16_TOLERANCE`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from freetoken.ops.cpu_moe import _ext

STACK_TOLERANCE = 1e-5  # relative RMS of the logits against the fp32 reference, fp32 inputs
BF16_TOLERANCE = 2e-2  # relative RMS of the logits, bf16 inputs (several layers of rounding)


@dataclass(frozen=True)
class AttentionLayer:
    """A paged GQA attention mixer (arguments as
    :func:`~freetoken.ops.attention_decode.paged_decode_attention`, gpt-oss's sinks, window and
    o_proj bias included); ``pool_layer``: its index in the KV pool's ``[layers, slots, nkv, hd]``
    tensors."""

    qkv_w: torch.Tensor
    o_w: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    num_heads: int
    num_kv_heads: int
    gated: bool
    eps: float
    scale: float
    input_norm: torch.Tensor
    input_eps: float
    pool_layer: int
    qkv_bias: torch.Tensor | None = None
    sinks: torch.Tensor | None = None
    window: int = 0
    o_bias: torch.Tensor | None = None


@dataclass(frozen=True)
class GdnLayer:
    """A Gated DeltaNet mixer (arguments as :func:`~freetoken.ops.gdn_decode.gdn_decode`)."""

    in_w: torch.Tensor
    conv_w: torch.Tensor
    dt_bias: torch.Tensor
    a_log: torch.Tensor
    norm_w: torch.Tensor
    out_w: torch.Tensor
    num_k_heads: int
    num_v_heads: int
    eps: float
    input_norm: torch.Tensor
    input_eps: float


@dataclass(frozen=True)
class MoeLayer:
    """A sparse MoE block with resident experts (arguments as
    :func:`~freetoken.ops.moe_block.moe_block_decode`, sigmoid and gpt-oss routing, gpt-oss's
    expert biases and bank sets read as stored included); a dense SwiGLU MLP is one expert,
    ``top_k`` 1, a zero router row (softmax weight exactly 1)."""

    norm: torch.Tensor
    eps: float
    router: torch.Tensor
    gate_up: torch.Tensor | tuple[torch.Tensor, ...]
    down: torch.Tensor | tuple[torch.Tensor, ...]
    shared_gate_up: torch.Tensor | None
    shared_down: torch.Tensor | None
    top_k: int
    norm_topk_prob: bool
    score_bias: torch.Tensor | None = None
    n_group: int = 1
    topk_group: int = 1
    routed_scaling: float = 1.0
    router_bias: torch.Tensor | None = None
    gate_up_bias: torch.Tensor | None = None
    down_bias: torch.Tensor | None = None
    swiglu_limit: float | None = None
    swiglu_alpha: float = 1.702
    expert_format: str | None = None
    block_size: tuple[int, int] | None = None
    activations: str = "fp32"


def _args(spec) -> tuple:
    return tuple(getattr(spec, f.name) for f in fields(spec))  # no copy of the tensors


class DecodeStack:
    """A decoder's decode step as one C++ call.

    Args:
        embed: ``[V_e, H]`` token embedding, fp32 or bf16 (the model dtype of every weight).
        final_norm: ``[H]`` fp32 multiplier of the final RMSNorm; final_eps: its epsilon.
        lm_head: ``[V, H]``.
        layers: per decoder layer ``(mixer, moe)``, mixer an :class:`AttentionLayer` or a
            :class:`GdnLayer`; every attention layer with the same KV head layout. The step's
            top-k ids are ``[layers, B, k]`` with ``k`` the largest ``top_k``; a block with a
            smaller one (a dense MLP) fills the first ``B * top_k`` values of its layer's rows.
        isa: kernel variant (``freetoken.ops.cpu_moe.cpu.supported_isas``).

    Raises:
        TypeError / ValueError: a wrong dtype, device, shape or layout (per layer the message
            starts with ``layer <l>:``).
    """

    def __init__(self, embed: torch.Tensor, final_norm: torch.Tensor, final_eps: float,
                 lm_head: torch.Tensor,
                 layers: list[tuple[AttentionLayer | GdnLayer, MoeLayer]],
                 isa: str | None = None) -> None:
        specs = [("attention" if isinstance(mixer, AttentionLayer) else "gdn", _args(mixer),
                  _args(moe)) for mixer, moe in layers]
        self._stack = _ext.DecodeStack(embed, final_norm, final_eps, lm_head, specs, isa=isa)
        self.gdn_layers = [i for i, (mixer, _) in enumerate(layers) if isinstance(mixer, GdnLayer)]

    def run(self, token_ids: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            pool_k: torch.Tensor | None, pool_v: torch.Tensor | None, kv_slots: torch.Tensor,
            kv_offsets: torch.Tensor, conv_states: list[list[torch.Tensor]],
            recurrent: list[list[torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode step of ``B`` sequences.

        Args:
            token_ids: ``[B]`` int64, each sequence's new token.
            cos, sin, kv_slots, kv_offsets: as
                :func:`~freetoken.ops.attention_decode.paged_decode_attention`, shared by every
                attention layer (unused without one).
            pool_k, pool_v: ``[pool layers, slots, nkv, hd]`` in the model dtype; the new K/V
                are written at each sequence's last slot of every attention layer.
            conv_states, recurrent: per Gated DeltaNet layer (in layer order), each sequence's
                conv / recurrent state, updated in place.

        Returns:
            ``(logits [B, V] fp32, topk_ids [layers, B, k] int64)``; with bf16 weights the
            logits hold bf16 values (the lm_head output in the model dtype).

        Raises:
            TypeError / ValueError: a wrong argument, a token id outside the embedding, a
                sequence without a slot or a slot outside the pool (no state is changed).
        """
        return self._stack.run(token_ids, cos, sin, pool_k, pool_v, kv_slots, kv_offsets,
                               conv_states, recurrent)
