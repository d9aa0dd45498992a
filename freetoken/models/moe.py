"""Sparse MoE block (router + routed experts + optional shared expert) and the dense MLP.

Source: transformers ``Qwen3MoeSparseMoeBlock`` / ``Qwen3NextSparseMoeBlock`` with their
``TopKRouter`` (model-architectures.md §1.5.4, §3): router logits ``x @ gate.weight.T``,
softmax in fp32, top-k of the probabilities, renormalised when ``norm_topk_prob``, cast to the
model dtype. Qwen3-Next adds a shared SwiGLU expert scaled by
``sigmoid(x @ shared_expert_gate.weight.T)``. The router and the shared-expert gate share one
fused weight ``[E (+1), H]``; the shared expert's gate_proj/up_proj are fused as ``[2Is, H]``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from freetoken.models.config import ModelConfig
from freetoken.models.loader import WeightTarget
from freetoken.models.moe_forward import ExpertWeights, swiglu
from freetoken.models.norms import RMSNorm
from freetoken.ops.linear import cpu_kernel_fits, linear
from freetoken.ops.moe_block import moe_block_decode


def _param(*shape: int, dtype: torch.dtype, device=None) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)


class DenseMLP(nn.Module):
    """SwiGLU MLP ``down(silu(gate(x)) * up(x))`` (``Qwen3MoeMLP`` / ``Qwen3NextMLP``).

    Args:
        hidden, intermediate: H and the MLP width.
        dtype, device: parameter dtype/device.
    """

    def __init__(self, hidden: int, intermediate: int, dtype: torch.dtype, device=None) -> None:
        super().__init__()
        self.intermediate = intermediate
        self.gate_up = _param(2 * intermediate, hidden, dtype=dtype, device=device)
        self.down = _param(hidden, intermediate, dtype=dtype, device=device)

    def weight_targets(self, prefix: str) -> dict[str, WeightTarget]:
        """``{prefix}{gate,up,down}_proj.weight`` -> parameters."""
        i = self.intermediate
        return {
            prefix + "gate_proj.weight": WeightTarget(self.gate_up[:i]),
            prefix + "up_proj.weight": WeightTarget(self.gate_up[i:]),
            prefix + "down_proj.weight": WeightTarget(self.down),
        }

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[T, H]`` -> ``[T, H]``."""
        return swiglu(x, self.gate_up, self.down)

    def block_weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(router [1, H] zeros, gate_up [1, 2I, H], down [1, H, I])``: this MLP as a MoE
        block of one expert (softmax over one logit gives it weight exactly 1), the form the
        C++ decode block and decode stack run."""
        zero = getattr(self, "_zero_router", None)
        if zero is None or zero.dtype != self.gate_up.dtype or zero.device != self.gate_up.device:
            zero = torch.zeros(1, self.gate_up.shape[1], dtype=self.gate_up.dtype,
                               device=self.gate_up.device)
            self._zero_router = zero
        return zero, self.gate_up.unsqueeze(0), self.down.unsqueeze(0)

    def fused_fits(self, h: torch.Tensor) -> bool:
        """Whether :meth:`forward_residual` takes ``h [T, H]`` (CPU, one kernel dtype, T at
        decode size)."""
        return cpu_kernel_fits(h, self.gate_up, self.down)

    def forward_residual(self, h: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
        """``h + self(norm(h))`` in one C++ call (:meth:`block_weights` through
        :func:`~freetoken.ops.moe_block.moe_block_decode`); returns ``h``'s dtype."""
        router, gate_up, down = self.block_weights()
        out, _ = moe_block_decode(h.contiguous(), norm.scale(), norm.eps, router, gate_up, down,
                                  None, None, top_k=1, norm_topk_prob=True)
        return out if h.dtype == torch.float32 else out.to(h.dtype)


RoutingObserver = Callable[[int, torch.Tensor], None]  # (MoE layer ordinal, topk ids [T, k])


class SparseMoE(nn.Module):
    """Top-k softmax-routed MoE with an optional sigmoid-gated shared expert.

    Args:
        config: E, top-k, norm_topk_prob, moe/shared intermediate sizes.
        layer: decoder layer index.
        dtype, device: parameter dtype/device.
        moe_layer: ordinal of this layer among the MoE layers (flat expert ids ``l * E + e``).
        experts: the routed-expert module, called ``experts(x [T, H], ids [T, k], weights [T, k])
            -> [T, H]`` and asked for ``weight_targets(prefix)``; default: resident
            :class:`ExpertWeights` parameters (the offload runtime passes its own).

    Attributes:
        routing_observer: when set, called with ``(moe_layer, topk_ids)`` after every routing
            (``--record-routing``).
    """

    def __init__(self, config: ModelConfig, layer: int, dtype: torch.dtype, device=None,
                 moe_layer: int = 0, experts: nn.Module | None = None) -> None:
        super().__init__()
        self.moe_layer = moe_layer
        self.routing_observer: RoutingObserver | None = None
        self.num_experts = config.num_experts
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        self.has_shared = config.shared_expert_intermediate_size > 0
        hidden = config.hidden_size
        rows = self.num_experts + (1 if self.has_shared else 0)
        self.router = _param(rows, hidden, dtype=dtype, device=device)
        if experts is None:
            experts = ExpertWeights(
                layer, self.num_experts, hidden, config.moe_intermediate_size, dtype, device
            )
        self.experts = experts
        if self.has_shared:
            self.shared = DenseMLP(hidden, config.shared_expert_intermediate_size, dtype, device)

    def weight_targets(self, prefix: str) -> dict[str, WeightTarget]:
        """HF names under ``prefix`` (``model.layers.N.mlp.``) -> parameters."""
        e = self.num_experts
        targets = {prefix + "gate.weight": WeightTarget(self.router[:e])}
        targets.update(self.experts.weight_targets(prefix + "experts."))
        if self.has_shared:
            targets[prefix + "shared_expert_gate.weight"] = WeightTarget(self.router[e:])
            targets.update(self.shared.weight_targets(prefix + "shared_expert."))
        return targets

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k routing of ``[T, E]`` router logits.

        Returns:
            ``(ids [T, k] int64, weights [T, k])`` weights in the logits' dtype.
        """
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return ids, weights.to(logits.dtype)

    def _block_experts(self, h: torch.Tensor) -> dict | None:
        """The experts' keywords for the fused block (their ``block_experts(h)``), or None for
        experts that have none (the offload runtime's) or do not fit it."""
        block_experts = getattr(self.experts, "block_experts", None)
        return None if block_experts is None else block_experts(h)

    def fused_fits(self, h: torch.Tensor) -> bool:
        """Whether :meth:`forward_residual` takes ``h [T, H]``: resident experts that fit the C++
        block (``block_experts``: dense stacks in ``h``'s dtype, or a bank set read as stored),
        and ``h``, the router and the shared expert on the CPU in one kernel dtype with T at
        decode size (``cpu_kernel_fits``)."""
        if self._block_experts(h) is None:
            return False
        shared = (self.shared.gate_up, self.shared.down) if self.has_shared else ()
        return cpu_kernel_fits(h, self.router, *shared)

    def forward_residual(self, h: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
        """``h + self(norm(h))`` in one C++ call (:func:`~freetoken.ops.moe_block.moe_block_decode`:
        the same math, each value the torch path keeps in the model dtype rounded where it is).

        Args:
            h: ``[T, H]`` residual stream (``fused_fits(h)``); norm: the post-attention norm.

        Returns:
            ``[T, H]`` in ``h``'s dtype.
        """
        shared = (self.shared.gate_up, self.shared.down) if self.has_shared else (None, None)
        out, ids = moe_block_decode(h.contiguous(), norm.scale(), norm.eps, self.router,
                                    shared_gate_up=shared[0], shared_down=shared[1],
                                    top_k=self.top_k, norm_topk_prob=self.norm_topk_prob,
                                    **self.block_kwargs(h))
        if self.routing_observer is not None:
            self.routing_observer(self.moe_layer, ids)
        return out if h.dtype == torch.float32 else out.to(h.dtype)

    def block_kwargs(self, h: torch.Tensor) -> dict:
        """Keyword arguments of :func:`~freetoken.ops.moe_block.moe_block_decode` (and fields of
        the decode stack's ``MoeLayer``) beyond the router, shared expert and top-k, for ``h``
        with ``fused_fits(h)``: the routed experts (gpt-oss adds its router bias, GLM its
        sigmoid routing)."""
        return self._block_experts(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[T, H]`` -> ``[T, H]`` routed experts (+ gated shared expert)."""
        logits = linear(x, self.router)
        ids, weights = self.route(logits[:, : self.num_experts])
        if self.routing_observer is not None:
            self.routing_observer(self.moe_layer, ids)
        out = self.experts(x, ids, weights)
        if self.has_shared:
            out = out + torch.sigmoid(logits[:, self.num_experts :]) * self.shared(x)
        return out
