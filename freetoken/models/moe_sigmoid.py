"""Sigmoid-scored, group-limited MoE routing with an ungated shared expert (GLM-4.5).

Source: transformers ``Glm4MoeTopkRouter`` / ``Glm4MoeMoE`` (DeepSeek-V3 style,
model-architectures.md §5.6): fp32 router logits ``x @ gate.weight.T``; scores
``sigmoid(logits)``; experts are chosen by ``scores + e_score_correction_bias`` among the
``topk_group`` groups (of ``n_group``) whose two best biased scores sum highest; their weights
are the unbiased scores, renormalised (``+ 1e-20``) when ``norm_topk_prob``, times
``routed_scaling_factor``. The shared experts (``n_shared_experts`` of width I, one fused MLP)
are added without a gate.
"""

from __future__ import annotations

import torch
from torch import nn

from freetoken.models.config import ModelConfig
from freetoken.models.loader import WeightTarget
from freetoken.models.moe import SparseMoE, _param
from freetoken.ops.linear import cpu_kernel_fits, linear


class SigmoidRoutedMoE(SparseMoE):
    """GLM-4.5 MoE block; the interface of :class:`SparseMoE` (experts, observer, offload).

    The router weight and score bias are kept in fp32 whatever the model dtype, as transformers
    computes the routing; the fused C++ decode block (:meth:`~SparseMoE.forward_residual`) does the same.
    """

    def __init__(self, config: ModelConfig, layer: int, dtype: torch.dtype, device=None,
                 moe_layer: int = 0, experts: nn.Module | None = None) -> None:
        super().__init__(config, layer, dtype, device, moe_layer, experts)
        self.router = _param(self.num_experts, config.hidden_size, dtype=torch.float32,
                             device=device)
        self.score_bias = _param(self.num_experts, dtype=torch.float32, device=device)
        self.n_group, self.topk_group = config.n_group, config.topk_group
        self.scaling = config.routed_scaling_factor

    def weight_targets(self, prefix: str) -> dict[str, WeightTarget]:
        """HF names under ``prefix`` (``model.layers.N.mlp.``) -> parameters."""
        targets = {prefix + "gate.weight": WeightTarget(self.router),
                   prefix + "gate.e_score_correction_bias": WeightTarget(self.score_bias)}
        targets.update(self.experts.weight_targets(prefix + "experts."))
        if self.has_shared:
            targets.update(self.shared.weight_targets(prefix + "shared_experts."))
        return targets

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[T, E]`` fp32 router logits -> ``(ids [T, k] int64, weights [T, k] fp32)``; ids in
        descending order of biased score."""
        scores = torch.sigmoid(logits)
        choice = scores + self.score_bias
        if self.topk_group < self.n_group:
            t, per = choice.shape[0], self.num_experts // self.n_group
            best_two = choice.view(t, self.n_group, per).topk(2, dim=-1).values.sum(-1)
            keep = torch.topk(best_two, self.topk_group, dim=-1).indices
            allowed = torch.zeros_like(best_two, dtype=torch.bool).scatter_(1, keep, True)
            choice = choice.masked_fill(~allowed.repeat_interleave(per, dim=1), float("-inf"))
        ids = torch.topk(choice, self.top_k, dim=-1).indices
        weights = scores.gather(1, ids)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return ids, weights * self.scaling

    def fused_fits(self, h: torch.Tensor) -> bool:
        """Whether :meth:`~SparseMoE.forward_residual` takes ``h [T, H]``: resident experts that
        fit the C++ block, the shared experts on the CPU in ``h``'s kernel dtype, T at decode
        size (the router is fp32, on the CPU)."""
        if self._block_experts(h) is None or self.router.device.type != "cpu":
            return False
        shared = (self.shared.gate_up, self.shared.down) if self.has_shared else ()
        return cpu_kernel_fits(h, *shared)

    def block_kwargs(self, h: torch.Tensor) -> dict:
        """The experts and the sigmoid group routing for the fused C++ decode block."""
        return {"score_bias": self.score_bias, "n_group": self.n_group,
                "topk_group": self.topk_group, "routed_scaling": self.scaling,
                **self._block_experts(h)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[T, H]`` -> ``[T, H]`` routed experts plus the shared experts."""
        ids, weights = self.route(linear(x.float(), self.router))
        if self.routing_observer is not None:
            self.routing_observer(self.moe_layer, ids)
        out = self.experts(x, ids, weights.to(x.dtype))
        return out + self.shared(x) if self.has_shared else out
