"""gpt-oss MoE: a biased top-k router and experts with biases and a clamped SwiGLU.

Source: transformers ``GptOssTopKRouter`` / ``GptOssExperts`` (model-architectures.md §4.3):
``logits = x @ W.T + b``; the top-k logits are softmaxed among themselves; expert ``e`` computes
``gu = W_gu[e] x + b_gu[e]``, ``g' = min(g, limit)``, ``u' = clamp(u, -limit, limit)``,
``y = W_down[e] ((u' + 1) g' sigmoid(alpha g')) + b_down[e]``. The released ``gate_up`` rows
interleave gate (even) and up (odd); here they are stored de-interleaved, gate rows ``[0:I]``
then up rows ``[I:2I]``, as every other family's experts (the row permutation is applied at
load, weights and biases alike). With resident experts a decode step runs the whole block in
one C++ call (:meth:`SparseMoE.forward_residual` with :meth:`GptOssMoE.block_kwargs`).
"""

from __future__ import annotations

import torch
from torch import nn

from freetoken.models.config import ModelConfig
from freetoken.models.loader import WeightTarget
from freetoken.models.moe import SparseMoE, _param
from freetoken.models.moe_forward import ClampedSwiGLU, grouped_swiglu
from freetoken.ops.linear import cpu_kernel_fits, linear


def deinterleave_rows(rows: int) -> torch.Tensor:
    """Row order that takes interleaved ``[g0, u0, g1, u1, ...]`` to ``[g0, g1, ..., u0, u1,
    ...]`` (``rows`` = 2I): the even rows, then the odd ones."""
    return torch.cat([torch.arange(0, rows, 2), torch.arange(1, rows, 2)])


class GptOssExperts(nn.Module):
    """Resident routed experts of one gpt-oss MoE layer.

    Attributes:
        layer: decoder layer index.
        gate_up: ``[E, 2I, H]`` gate rows ``[0:I]``, up rows ``[I:2I]``.
        gate_up_bias: ``[E, 2I]`` fp32, same row order.
        down: ``[E, H, I]``; down_bias: ``[E, H]`` fp32.
        limit, alpha: ``swiglu_limit`` and ``swiglu_alpha``.
    """

    def __init__(self, layer: int, config: ModelConfig, dtype: torch.dtype, device=None) -> None:
        super().__init__()
        e, h, i = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.layer, self.intermediate = layer, i
        self.limit, self.alpha = config.swiglu_limit, config.swiglu_alpha
        self.gate_up = _param(e, 2 * i, h, dtype=dtype, device=device)
        self.down = _param(e, h, i, dtype=dtype, device=device)
        self.gate_up_bias = _param(e, 2 * i, dtype=torch.float32, device=device)
        self.down_bias = _param(e, h, dtype=torch.float32, device=device)

    @property
    def num_experts(self) -> int:
        """E."""
        return self.gate_up.shape[0]

    def weight_targets(self, prefix: str) -> dict[str, WeightTarget]:
        """Per-expert canonical names (see ``loader.Checkpoint``): ``{prefix}{e}.gate_up_proj``
        ``[2I, H]``, ``{prefix}{e}.down_proj`` ``[H, I]`` and their ``_bias`` rows."""
        order = deinterleave_rows(2 * self.intermediate)
        targets = {}
        for e in range(self.num_experts):
            targets[f"{prefix}{e}.gate_up_proj"] = WeightTarget(self.gate_up[e], order)
            targets[f"{prefix}{e}.gate_up_proj_bias"] = WeightTarget(self.gate_up_bias[e], order)
            targets[f"{prefix}{e}.down_proj"] = WeightTarget(self.down[e])
            targets[f"{prefix}{e}.down_proj_bias"] = WeightTarget(self.down_bias[e])
        return targets

    def block_experts(self, h: torch.Tensor) -> dict | None:
        """The fused decode block's routed-expert keywords for ``h [T, H]`` (the stacks, the
        biases and the clamp), or None when the stacks do not fit the C++ kernels (CPU, ``h``'s
        dtype, decode size)."""
        if not cpu_kernel_fits(h, self.gate_up, self.down):
            return None
        return {"gate_up": self.gate_up, "down": self.down, **self.activation().kernel_args()}

    def activation(self) -> ClampedSwiGLU:
        """This layer's biased, clamped MLP over its ``E`` expert rows."""
        return ClampedSwiGLU(self.gate_up_bias, self.down_bias, self.limit, self.alpha)

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``x [T, H]``, ``ids [T, k]`` int64, ``weights [T, k]`` -> ``[T, H]`` in ``x``'s dtype
        (:func:`~freetoken.models.moe_forward.grouped_swiglu` with :meth:`activation`)."""
        return grouped_swiglu(x, ids, weights, self.gate_up, self.down, self.activation())


class GptOssMoE(SparseMoE):
    """gpt-oss MoE block; the interface of :class:`SparseMoE` (observer, expert module)."""

    def __init__(self, config: ModelConfig, layer: int, dtype: torch.dtype, device=None,
                 moe_layer: int = 0, experts: nn.Module | None = None) -> None:
        if experts is None:
            experts = GptOssExperts(layer, config, dtype, device)
        super().__init__(config, layer, dtype, device, moe_layer, experts)
        self.router_bias = _param(self.num_experts, dtype=dtype, device=device)

    def weight_targets(self, prefix: str) -> dict[str, WeightTarget]:
        """``{prefix}router.{weight,bias}`` and the experts under ``{prefix}experts.``."""
        targets = {prefix + "router.weight": WeightTarget(self.router),
                   prefix + "router.bias": WeightTarget(self.router_bias)}
        targets.update(self.experts.weight_targets(prefix + "experts."))
        return targets

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[T, E]`` biased router logits -> ``(ids [T, k] int64, weights [T, k])``: the top-k
        logits, softmaxed among themselves in the logits' dtype."""
        top, ids = torch.topk(logits, self.top_k, dim=-1)
        return ids, torch.softmax(top, dim=-1)

    def fused_fits(self, h: torch.Tensor) -> bool:
        """Whether :meth:`~SparseMoE.forward_residual` takes ``h [T, H]``: resident experts
        that fit the C++ block (``block_experts``), the router on the CPU in ``h``'s dtype."""
        return self._block_experts(h) is not None and cpu_kernel_fits(h, self.router)

    def block_kwargs(self, h: torch.Tensor) -> dict:
        """gpt-oss routing (the router bias, fp32 holding model-dtype values) and the experts
        (with their biases and clamped SwiGLU) for the fused C++ decode block."""
        return {"router_bias": self.router_bias.float(), **self._block_experts(h)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[T, H]`` -> ``[T, H]``."""
        ids, weights = self.route(linear(x, self.router) + self.router_bias)
        if self.routing_observer is not None:
            self.routing_observer(self.moe_layer, ids)
        return self.experts(x, ids, weights)
