"""Plain-torch fp32 reference of the CPU expert kernel (same signature as :func:`cpu.cpu_moe`).

Shape letters: T tokens, H hidden, I expert intermediate, N flat expert ids ``l * E + e``,
P (token, expert, weight) triples. Source: the SwiGLU expert MLP of transformers v5
``Qwen3MoeExperts`` / ``OlmoeExperts`` (fused ``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]``):
``y = down @ (silu(gate @ x) * (up @ x))`` with gate rows ``[0:I]`` and up rows ``[I:2I]``,
weighted by the router's top-k weight and summed per token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from freetoken.ops.cpu_moe.formats import ExpertBankView


def cpu_moe_reference(
    x: torch.Tensor,
    token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    *,
    activations: str = "fp32",
) -> torch.Tensor:
    """Gate-weighted SwiGLU expert outputs summed per token, in fp32, looping over experts.

    Args:
        x: ``[T, H]`` hidden states (any float dtype; upcast to fp32).
        token_ids: ``[P]`` int64 token row of each triple, in ``[0, T)``.
        expert_ids: ``[P]`` int64 flat expert id of each triple, in ``[0, N)``; ``-1`` skips it.
        weights: ``[P]`` gate (top-k) weight of each triple.
        gate_up: ``[N, 2I, H]`` expert bank, rows ``[0:I]`` gate and ``[I:2I]`` up.
        down: ``[N, H, I]`` expert bank.
        activations: ``"fp32"``, or ``"bf16"``: the kernel's ``activations="bf16"`` contract,
            ``x`` and ``silu(g) * u`` rounded to bf16 (nearest even) before each matrix.

    Returns:
        ``[T, H]`` fp32 partial sums (zeros for tokens no triple names).

    Raises:
        ValueError: ``activations`` is neither ``"fp32"`` nor ``"bf16"``.
    """
    if activations not in ("fp32", "bf16"):
        raise ValueError(f"activations must be 'fp32' or 'bf16', got {activations!r}")

    def entering(v: torch.Tensor) -> torch.Tensor:  # what a matrix multiplies
        return v.bfloat16().float() if activations == "bf16" else v

    t, h = x.shape
    i = down.shape[2]
    out = torch.zeros(t, h, dtype=torch.float32)
    xf = entering(x.float())
    for e in torch.unique(expert_ids[expert_ids >= 0]).tolist():
        sel = (expert_ids == e).nonzero().flatten()  # [n]
        tok = token_ids[sel]  # [n]
        gu = xf[tok] @ gate_up[e].float().t()  # [n, 2I]
        act = entering(F.silu(gu[:, :i]) * gu[:, i:])  # [n, I]
        y = act @ down[e].float().t()  # [n, H]
        out.index_add_(0, tok, y * weights[sel].float()[:, None])
    return out


def cpu_moe_reference_banks(
    x: torch.Tensor,
    token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    weights: torch.Tensor,
    banks: ExpertBankView,
    *,
    activations: str = "fp32",
) -> torch.Tensor:
    """:func:`cpu_moe_reference` on ``banks`` dequantised to fp32 (exactly; any format).

    Returns ``[T, H]`` fp32; the arguments are as in :func:`freetoken.ops.cpu_moe.cpu.submit_banks`
    (``activations`` ``"fp32"`` or ``"bf16"``).
    """
    gate_up, down = banks.dequantize()
    return cpu_moe_reference(x, token_ids, expert_ids, weights, gate_up, down,
                             activations=activations)


def relative_rms_error(ref: torch.Tensor, out: torch.Tensor) -> float:
    """``rms(out - ref) / rms(ref)`` in fp64; ``inf`` if ``out`` has a NaN/inf, 0 for two zeros.

    The error metric the tolerances of :mod:`freetoken.ops.cpu_moe` bound.
    """
    if not torch.isfinite(out).all():
        return float("inf")
    diff = (out.double() - ref.double()).pow(2).mean().sqrt().item()
    scale = ref.double().pow(2).mean().sqrt().item()
    return diff / scale if scale > 0 else diff
