"""Routed-expert computation of a sparse MoE layer (the part an expert cache will replace).

Source: transformers ``Qwen3MoeExperts.forward`` / ``Qwen3NextExperts.forward``
(model-architectures.md §1.5.4): each routed expert is a SwiGLU MLP
``down(silu(gate(x)) * up(x))`` and a token's output is ``sum_j w_j * Expert_{idx_j}(x)``.
Tokens are grouped by expert (one stable sort) and only experts that received tokens run; a
single token (decode) just loops over its top-k experts. gpt-oss's experts add biases and clamp
the SwiGLU (:class:`ClampedSwiGLU`, transformers ``GptOssExperts``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from freetoken.models.loader import WeightTarget
from freetoken.ops.cpu_moe.cpu import cpu_moe
from freetoken.ops.linear import KERNEL_MAX_ROWS, cpu_kernel_fits, linear


class ExpertWeights(nn.Module):
    """Routed expert weights of one MoE layer, stacked.

    Attributes:
        layer: decoder layer index (for caches/offloading keyed by layer).
        gate_up: ``[E, 2I, H]`` rows ``[0:I]`` gate_proj, ``[I:2I]`` up_proj of each expert.
        down: ``[E, H, I]`` down_proj of each expert.
    """

    def __init__(self, layer: int, num_experts: int, hidden: int, intermediate: int,
                 dtype: torch.dtype, device=None) -> None:
        super().__init__()
        self.layer = layer
        self.intermediate = intermediate
        self.gate_up = nn.Parameter(
            torch.empty(num_experts, 2 * intermediate, hidden, dtype=dtype, device=device),
            requires_grad=False,
        )
        self.down = nn.Parameter(
            torch.empty(num_experts, hidden, intermediate, dtype=dtype, device=device),
            requires_grad=False,
        )

    @property
    def num_experts(self) -> int:
        """E."""
        return self.gate_up.shape[0]

    def forward(self, hidden: torch.Tensor, topk_ids: torch.Tensor,
                topk_weights: torch.Tensor) -> torch.Tensor:
        """:func:`moe_forward` over these weights: ``[T, H]`` -> ``[T, H]``."""
        return moe_forward(hidden, topk_ids, topk_weights, self)

    def block_experts(self, h: torch.Tensor) -> dict | None:
        """The routed-expert keywords of the fused C++ decode block
        (:func:`~freetoken.ops.moe_block.moe_block_decode`, the decode stack's ``MoeLayer``) for
        ``h [T, H]``, or None when the stacks are not on the CPU in ``h``'s kernel dtype or T
        exceeds decode size."""
        if not cpu_kernel_fits(h, self.gate_up, self.down):
            return None
        return {"gate_up": self.gate_up, "down": self.down}

    def weight_targets(self, prefix: str) -> dict[str, WeightTarget]:
        """Per-expert HF names ``{prefix}E.{gate,up,down}_proj.weight`` -> rows of the stacks."""
        i = self.intermediate
        targets = {}
        for e in range(self.num_experts):
            targets[f"{prefix}{e}.gate_proj.weight"] = WeightTarget(self.gate_up[e, :i])
            targets[f"{prefix}{e}.up_proj.weight"] = WeightTarget(self.gate_up[e, i:])
            targets[f"{prefix}{e}.down_proj.weight"] = WeightTarget(self.down[e])
        return targets


def clamped_swiglu(gate_up: torch.Tensor, limit: float, alpha: float) -> torch.Tensor:
    """gpt-oss's activation: ``[N, 2I]`` (gate columns first, biases added) -> ``[N, I]`` fp32
    ``(clamp(u, -limit, limit) + 1) * g' * sigmoid(alpha * g')`` with ``g' = min(g, limit)``."""
    gate, up = gate_up.float().chunk(2, dim=-1)
    gate = gate.clamp(max=limit)
    up = up.clamp(-limit, limit)
    return (up + 1) * gate * torch.sigmoid(gate * alpha)


@dataclass(frozen=True)
class ClampedSwiGLU:
    """The biased, clamped expert MLP of gpt-oss for the rows of one stacked weight set:
    ``y = down (act(gate_up x + b_gu)) + b_down`` with :func:`clamped_swiglu` as ``act``.

    Attributes:
        gate_up_bias: ``[R, 2I]`` fp32 (gate then up, the rows' order).
        down_bias: ``[R, H]`` fp32.
        limit, alpha: ``swiglu_limit`` and ``swiglu_alpha``.
    """

    gate_up_bias: torch.Tensor
    down_bias: torch.Tensor
    limit: float
    alpha: float

    def kernel_args(self) -> dict:
        """The keyword arguments of the C++ expert kernel that select this MLP."""
        return {"gate_up_bias": self.gate_up_bias, "down_bias": self.down_bias,
                "swiglu_limit": self.limit, "swiglu_alpha": self.alpha}

    def mlp(self, x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
            row: int) -> torch.Tensor:
        """Row ``row``'s expert on ``x [N, H]`` -> ``[N, H]`` in ``x``'s dtype."""
        gu = linear(x, gate_up).float() + self.gate_up_bias[row]
        act = clamped_swiglu(gu, self.limit, self.alpha).to(x.dtype)
        return (linear(act, down).float() + self.down_bias[row]).to(x.dtype)


def swiglu(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """SwiGLU ``down(silu(gate(x)) * up(x))``.

    Args:
        x: ``[N, H]``; gate_up: ``[2I, H]`` (gate rows first); down: ``[H, I]``.

    Returns:
        ``[N, H]`` in ``x``'s dtype.
    """
    gate, up = linear(x, gate_up).chunk(2, dim=-1)
    return linear(F.silu(gate) * up, down)


def kernel_max_tokens(num_rows: int, top_k: int) -> int:
    """Most tokens whose routed entries the C++ expert kernel takes for ``num_rows`` stacked
    experts (or cache slots) and ``top_k`` entries per token: ``KERNEL_MAX_ROWS`` rows per
    expert on average, and never fewer than ``KERNEL_MAX_ROWS`` tokens. Past it the per-expert
    torch matmuls win (measured on the small presets: 64 experts, top-8, the kernel 2.3-2.7x
    faster at 16-64 tokens, slower from ~130)."""
    return max(KERNEL_MAX_ROWS, KERNEL_MAX_ROWS * num_rows // max(top_k, 1))


def grouped_swiglu(
    hidden: torch.Tensor,
    expert_ids: torch.Tensor,
    weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    act: ClampedSwiGLU | None = None,
) -> torch.Tensor:
    """Gate-weighted sum of SwiGLU experts over routed ``(token, expert)`` entries, skipping ``-1``.

    Tokens are grouped by expert (one stable sort) and only experts that received tokens run; a
    single token (decode) just loops over its entries. Used for the resident experts of a layer
    and for the device branch of the offload runtime (``expert_ids`` = cache slot ids, ``-1`` for
    entries the CPU branch computes).

    Args:
        hidden: ``[T, H]`` (model dtype).
        expert_ids: ``[T, k]`` int64 rows of ``gate_up`` / ``down``, or ``-1`` to skip the entry.
        weights: ``[T, k]`` routing weights, ``hidden``'s dtype.
        gate_up: ``[R, 2I, H]`` stacked gate (rows ``0:I``) and up projections.
        down: ``[R, H, I]``.
        act: gpt-oss's biased, clamped MLP over the same ``R`` rows, or None (plain SwiGLU).

    Returns:
        ``[T, H]`` (zeros where every entry of a token is skipped).

    On the CPU, while the entries average at most ``freetoken.ops.linear.KERNEL_MAX_ROWS`` per
    stacked expert (``T * k <= KERNEL_MAX_ROWS * R``: decode and short prefill chunks;
    :func:`kernel_max_tokens`), every entry runs in one call of the C++ expert kernel
    (``freetoken.ops.cpu_moe``: each routed expert's weights streamed once, fp32 activations and
    sums), the result cast to ``hidden``'s dtype.
    """
    t, k = expert_ids.shape
    if cpu_kernel_fits(hidden, gate_up, down, max_rows=kernel_max_tokens(gate_up.shape[0], k)):
        tok = torch.arange(t).repeat_interleave(k)
        out = cpu_moe(hidden.contiguous(), tok, expert_ids.flatten(),
                      weights.flatten().float(), gate_up, down,
                      **(act.kernel_args() if act is not None else {}))
        return out.to(hidden.dtype)

    def expert(x: torch.Tensor, e: int) -> torch.Tensor:
        return swiglu(x, gate_up[e], down[e]) if act is None else act.mlp(x, gate_up[e],
                                                                          down[e], e)

    if t == 1:
        out = None
        for j, e in enumerate(expert_ids[0].tolist()):
            if e < 0:
                continue
            y = expert(hidden, e) * weights[0, j]
            out = y if out is None else out + y
        return torch.zeros_like(hidden) if out is None else out
    flat = expert_ids.flatten()
    order = flat.argsort(stable=True)
    skipped = int((flat < 0).sum())
    order = order[skipped:]  # -1 entries sort first
    if order.numel() == 0:
        return torch.zeros_like(hidden)
    counts = torch.bincount(flat.index_select(0, order)).tolist()
    token_of = order // k
    x_sorted = hidden.index_select(0, token_of)
    y_sorted = torch.empty_like(x_sorted)
    start = 0
    for e, count in enumerate(counts):
        if count:
            rows = slice(start, start + count)
            y_sorted[rows] = expert(x_sorted[rows], e)
            start += count
    y_sorted *= weights.flatten().index_select(0, order)[:, None]
    return torch.zeros_like(hidden).index_add_(0, token_of, y_sorted)


def moe_forward(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    experts: ExpertWeights,
) -> torch.Tensor:
    """Weighted sum of each token's top-k routed experts (all experts resident).

    Args:
        hidden: ``[T, H]`` MoE input (model dtype).
        topk_ids: ``[T, k]`` int64 expert ids in ``[0, E)``.
        topk_weights: ``[T, k]`` routing weights, ``hidden``'s dtype.
        experts: the layer's stacked expert weights.

    Returns:
        ``[T, H]`` routed output (shared expert not included).
    """
    return grouped_swiglu(hidden, topk_ids, topk_weights, experts.gate_up, experts.down)
