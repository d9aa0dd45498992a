"""Plain-torch fp32 reference of the CPU expert kernel (same signature as :func:`cpu.cpu_moe`).

Shape letters: T tokens, H hidden, I expert intermediate, N flat expert ids ``l * E + e``,
P (token, expert, weight) triples. Source: the SwiGLU expert MLP of transformers v5
``Qwen3MoeExperts`` / ``OlmoeExperts`` (fused ``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]``):
``y = down @ (silu(gate @ x) * (up @ x))`` with gate rows ``[0:I]`` and up rows ``[I:2I]``,
weighted by the router's top-k weight and summed per token.

gpt-oss experts (transformers v5 ``GptOssExperts``, its interleaved gate/up columns taken apart
so that gate rows come first): optional biases ``g = gate @ x + b_gate``, ``u = up @ x + b_up``,
``y = down @ act + b_down``, and with ``swiglu_limit`` the clamped activation
``act = (u' + 1) * g' * sigmoid(alpha * g')``, ``g' = min(g, limit)``,
``u' = clamp(u, -limit, limit)`` (:func:`expert_activation`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from freetoken.ops.cpu_moe.formats import ExpertBankView


def expert_activation(gu: torch.Tensor, swiglu_limit: float | None = None,
                      swiglu_alpha: float = 1.702) -> torch.Tensor:
    """The expert activation of ``gu [n, 2I]`` (gate ``[:, :I]``, up ``[:, I:]``, biases already
    added): ``silu(g) * u`` without ``swiglu_limit``, else gpt-oss's clamped SwiGLU (as
    transformers ``GptOssExperts._apply_gate``). Returns ``[n, I]`` in ``gu``'s dtype."""
    i = gu.shape[-1] // 2
    g, u = gu[..., :i], gu[..., i:]
    if swiglu_limit is None:
        return F.silu(g) * u
    g = g.clamp(max=swiglu_limit)
    u = u.clamp(min=-swiglu_limit, max=swiglu_limit)
    return (u + 1) * (g * torch.sigmoid(g * swiglu_alpha))


def cpu_moe_reference(
    x: torch.Tensor,
    token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    *,
    activations: str = "fp32",
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
    swiglu_limit: float | None = None,
    swiglu_alpha: float = 1.702,
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
            ``x`` and the activation rounded to bf16 (nearest even) before each matrix.
        gate_up_bias: ``[N, 2I]`` biases of ``g`` (``[:, :I]``) and ``u`` (``[:, I:]``), added
            in fp32 before the activation, or None.
        down_bias: ``[N, H]`` biases added in fp32 to each expert's down output before the
            gate weight, or None.
        swiglu_limit, swiglu_alpha: the activation (:func:`expert_activation`); None: SiLU.

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
    out = torch.zeros(t, h, dtype=torch.float32)
    xf = entering(x.float())
    for e in torch.unique(expert_ids[expert_ids >= 0]).tolist():
        sel = (expert_ids == e).nonzero().flatten()  # [n]
        tok = token_ids[sel]  # [n]
        gu = xf[tok] @ gate_up[e].float().t()  # [n, 2I]
        if gate_up_bias is not None:
            gu = gu + gate_up_bias[e].float()
        act = entering(expert_activation(gu, swiglu_limit, swiglu_alpha))  # [n, I]
        y = act @ down[e].float().t()  # [n, H]
        if down_bias is not None:
            y = y + down_bias[e].float()
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
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
    swiglu_limit: float | None = None,
    swiglu_alpha: float = 1.702,
) -> torch.Tensor:
    """:func:`cpu_moe_reference` on ``banks`` dequantised to fp32 (any format:
    ``banks.dequantize()``, exact for dense, mxfp4 and q4g banks; fp8 and nvfp4 banks give the
    fp32 values of their published dequantisers, see :mod:`freetoken.ops.cpu_moe.quant`).

    Returns ``[T, H]`` fp32; the arguments are as in :func:`freetoken.ops.cpu_moe.cpu.submit_banks`
    (``activations`` ``"fp32"`` or ``"bf16"``).
    """
    gate_up, down = banks.dequantize()
    return cpu_moe_reference(x, token_ids, expert_ids, weights, gate_up, down,
                             activations=activations, gate_up_bias=gate_up_bias,
                             down_bias=down_bias, swiglu_limit=swiglu_limit,
                             swiglu_alpha=swiglu_alpha)


def relative_rms_error(ref: torch.Tensor, out: torch.Tensor) -> float:
    """``rms(out - ref) / rms(ref)`` in fp64; ``inf`` if ``out`` has a NaN/inf, 0 for two zeros.

    The error metric the tolerances of :mod:`freetoken.ops.cpu_moe` bound.
    """
    if not torch.isfinite(out).all():
        return float("inf")
    diff = (out.double() - ref.double()).pow(2).mean().sqrt().item()
    scale = ref.double().pow(2).mean().sqrt().item()
    return diff / scale if scale > 0 else diff
