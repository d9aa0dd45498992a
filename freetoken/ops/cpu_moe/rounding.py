"""Rounding ambiguity of the kernel's rounded activation paths (``activations="bf16"`` / ``"q8"``).

Both paths round ``act = silu(g) * u`` (bf16: to the nearest bf16; q8: to a multiple of its block's
scale ``d``) before the down matrix. The kernel and the torch reference compute ``g`` and ``u`` in
fp32 in different summation orders, so an element lying within that difference of a rounding
boundary may round up in one and down in the other: one step of ``act`` (a bf16 ulp, or ``d``)
times its column of the down matrix, far above the fp32 summation bound when it happens (measured
5e-4 relative RMS for one q8 element at H = 2048, I = 768). :func:`bf16_rounding_candidates` and
:func:`q8_rounding_candidates` therefore list, beside the references, the elements that could
round either way (``RoundingCandidates``), and
:func:`relative_rms_error_up_to_rounding` removes from the residual the combination of those
alternatives that best explains it before measuring it, so the accumulation bounds stay tight.

An element is ambiguous when its distance to the nearest rounding boundary is at most
``margin = 2^-20 * (|silu'(g)| |u| A_g + |silu(g)| A_u) + 2^-21 |act|``, where ``A_g``, ``A_u``
are the absolute sums ``sum_k |W[j, k]| |x_k|`` (the scale of fp32 summation error, 16x its
typical size) and the last term covers ``expf`` and the product's own rounding. With gpt-oss's
clamped activation (``swiglu_limit``) the two derivatives are those of ``(u' + 1) * glu(g')``,
taken at the clamped values (the clamp only flattens the activation, so the one-sided derivative
bounds a change across the limit), and a bias adds its magnitude to ``A`` (its fp32 addition).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

SUM_EPS = 2.0**-20
ELEMENT_EPS = 2.0**-21


@dataclass(frozen=True)
class RoundingCandidates:
    """Activations that may round the other way in the kernel, and what that would change.

    Attributes:
        token: ``[F]`` int64 token row whose output the alternative changes.
        effect: ``[F, H]`` fp32 change of that token's output if the element took its other
            rounding (gate weight x step x the down matrix's column).
    """

    token: torch.Tensor
    effect: torch.Tensor

    @staticmethod
    def empty(h: int) -> RoundingCandidates:
        return RoundingCandidates(torch.zeros(0, dtype=torch.int64), torch.zeros(0, h))

    @staticmethod
    def concat(parts: list[RoundingCandidates], h: int) -> RoundingCandidates:
        if not parts:
            return RoundingCandidates.empty(h)
        return RoundingCandidates(torch.cat([p.token for p in parts]),
                                  torch.cat([p.effect for p in parts]))


def act_margin(gu: torch.Tensor, gu_abs: torch.Tensor, swiglu_limit: float | None = None,
               swiglu_alpha: float = 1.702) -> torch.Tensor:
    """Per-element bound on the fp32 difference of the activation between two summation orders.

    Args:
        gu: ``[n, 2I]`` fp32 gate/up values (gate ``[:, :I]``, up ``[:, I:]``, biases added).
        gu_abs: ``[n, 2I]`` absolute sums ``|W| @ |x|`` of the same rows (plus ``|bias|``).
        swiglu_limit, swiglu_alpha: the activation (``reference.expert_activation``).

    Returns:
        ``[n, I]`` fp32 margins.
    """
    i = gu.shape[1] // 2
    g, u = gu[:, :i].double(), gu[:, i:].double()
    if swiglu_limit is None:
        sig = torch.sigmoid(g)
        d_g = sig * (1 + g * (1 - sig)) * u  # d act / d g
        d_u = F.silu(g)  # d act / d u
        act = F.silu(g) * u
    else:
        g = g.clamp(max=swiglu_limit)
        u = u.clamp(min=-swiglu_limit, max=swiglu_limit)
        sig = torch.sigmoid(swiglu_alpha * g)
        d_g = sig * (1 + swiglu_alpha * g * (1 - sig)) * (u + 1)
        d_u = g * sig
        act = (u + 1) * d_u
    return (SUM_EPS * (d_g.abs() * gu_abs[:, :i] + d_u.abs() * gu_abs[:, i:])
            + ELEMENT_EPS * act.abs()).float()


def bf16_alternatives(act: torch.Tensor, margin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ambiguous [n, I] bool, other_minus_chosen [n, I] fp32)`` for rounding to bf16.

    ``chosen`` is ``act`` rounded to nearest bf16; ``other`` the bf16 neighbour on ``act``'s side.
    """
    chosen = act.bfloat16().float()
    _, exp = torch.frexp(act)  # |act| in [2^(exp-1), 2^exp)
    spacing = torch.ldexp(torch.ones_like(act), exp - 8)  # bf16 ulp there
    dist = (act - chosen).abs()
    ambiguous = ((dist - spacing / 2).abs() <= margin) & (act != 0) & torch.isfinite(act)
    side = torch.where(act >= chosen, 1.0, -1.0)
    return ambiguous, side * spacing


def q8_alternatives(act: torch.Tensor, margin: torch.Tensor, d: torch.Tensor,
                    block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ambiguous [n, C] bool, other_minus_chosen [n, C] fp32)`` for q8 rounding (``q = round(
    act / d)`` per block of ``block`` columns, ``d [n, C / block]``), in activation units."""
    dd = d.repeat_interleave(block, dim=-1)
    ok = (dd > 0) & torch.isfinite(dd)
    ratio = act / torch.where(ok, dd, torch.ones_like(dd))
    q = torch.round(ratio)
    frac = (ratio - q).abs()
    # The block scale may differ by an ulp of absmax too: 127 ulps of q in the worst case.
    ambiguous = ok & ((frac - 0.5).abs() <= margin / torch.where(ok, dd, torch.ones_like(dd))
                      + 127 * 2.0**-22) & (q.abs() < 127)
    side = torch.where(ratio >= q, 1.0, -1.0)
    return ambiguous, side * dd


def candidates_for(tok: torch.Tensor, weights: torch.Tensor, ambiguous: torch.Tensor,
                   step: torch.Tensor, down: torch.Tensor) -> RoundingCandidates:
    """Candidates of one expert: ``tok [n]``, gate ``weights [n]``, ``ambiguous``/``step [n, I]``
    from :func:`bf16_alternatives` / :func:`q8_alternatives`, ``down [H, I]`` fp32 weights."""
    rows, cols = ambiguous.nonzero(as_tuple=True)
    effect = (weights[rows] * step[rows, cols])[:, None] * down[:, cols].t()  # [F, H]
    return RoundingCandidates(tok[rows], effect.float())


def relative_rms_error_up_to_rounding(ref: torch.Tensor, out: torch.Tensor,
                                      cands: RoundingCandidates) -> float:
    """:func:`relative_rms_error` of ``out`` after removing, per token, the 0/1 combination of the
    candidates' effects that best explains ``out - ref``.

    The combination starts from the least-squares fit rounded to 0 or 1 (kept only if it lowers
    the residual), then single candidates are toggled while that lowers it, so the result never
    exceeds ``relative_rms_error(ref, out)`` and equals it with no candidates. It is chosen from
    at most a few percent of the activations, so it cannot absorb an error spread over the output.
    """
    from freetoken.ops.cpu_moe.reference import relative_rms_error

    if not torch.isfinite(out).all():
        return float("inf")
    corrected = out.double().clone()
    for t in torch.unique(cands.token).tolist():
        cols = cands.effect[cands.token == t].double().t()  # [H, F_t]
        resid = corrected[t] - ref[t].double()
        fit = torch.linalg.lstsq(cols, resid[:, None]).solution[:, 0].round().clamp(0, 1)
        if (resid - cols @ fit).norm() >= resid.norm():
            fit = torch.zeros_like(fit)
        r = resid - cols @ fit
        for _ in range(3):  # toggle single candidates while that helps
            changed = False
            for j in range(cols.shape[1]):
                trial = r + cols[:, j] if fit[j] == 1 else r - cols[:, j]
                if trial.norm() < r.norm():
                    r, fit[j], changed = trial, 1 - fit[j], True
            if not changed:
                break
        corrected[t] = ref[t].double() + r
    return relative_rms_error(ref, corrected.float())


def _experts(expert_ids: torch.Tensor):
    for e in torch.unique(expert_ids[expert_ids >= 0]).tolist():
        yield e, (expert_ids == e).nonzero().flatten()


def _with_bias(gu: torch.Tensor, gu_abs: torch.Tensor, gate_up_bias: torch.Tensor | None,
               e: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``gu`` and its absolute sums with expert ``e``'s gate/up bias added (None: unchanged)."""
    if gate_up_bias is None:
        return gu, gu_abs
    b = gate_up_bias[e].float()
    return gu + b, gu_abs + b.abs().double()


def bf16_rounding_candidates(x: torch.Tensor, token_ids: torch.Tensor, expert_ids: torch.Tensor,
                             weights: torch.Tensor, gate_up: torch.Tensor,
                             down: torch.Tensor, *, gate_up_bias: torch.Tensor | None = None,
                             swiglu_limit: float | None = None,
                             swiglu_alpha: float = 1.702) -> RoundingCandidates:
    """The ambiguous activations of ``cpu_moe_reference(..., activations="bf16")`` (same
    arguments: ``x [T, H]``, triples ``[P]``, banks ``[N, 2I, H]`` / ``[N, H, I]``, the gpt-oss
    options; the down bias, added after the rounding, plays no part)."""
    from freetoken.ops.cpu_moe.reference import expert_activation

    h = x.shape[1]
    xb = x.float().bfloat16().float()
    parts = []
    for e, sel in _experts(expert_ids):
        tok = token_ids[sel]
        w_gu = gate_up[e].float()
        gu, gu_abs = _with_bias(xb[tok] @ w_gu.t(),
                                xb[tok].abs().double() @ w_gu.abs().double().t(), gate_up_bias, e)
        act = expert_activation(gu, swiglu_limit, swiglu_alpha)
        margin = act_margin(gu, gu_abs, swiglu_limit, swiglu_alpha)
        ambiguous, step = bf16_alternatives(act, margin)
        parts.append(candidates_for(tok, weights[sel].float(), ambiguous, step, down[e].float()))
    return RoundingCandidates.concat(parts, h)


def q8_rounding_candidates(x: torch.Tensor, token_ids: torch.Tensor, expert_ids: torch.Tensor,
                           weights: torch.Tensor, banks,  # noqa: ANN001
                           *, gate_up_bias: torch.Tensor | None = None,
                           swiglu_limit: float | None = None,
                           swiglu_alpha: float = 1.702) -> RoundingCandidates:
    """The ambiguous activations of ``cpu_moe_reference_q8`` (same arguments; 4-bit ``banks``;
    the down bias, added after the quantised matrix, plays no part)."""
    from freetoken.ops.cpu_moe.reference import expert_activation
    from freetoken.ops.cpu_moe.reference_q8 import (
        Q8_BLOCK,
        _integer_weights,
        _q8_matmul,
        quantize_q8_blocks,
    )

    h = x.shape[1]
    xq, xd = quantize_q8_blocks(x.float())
    xdeq = xq.float() * xd.repeat_interleave(Q8_BLOCK, dim=-1)

    def expert(bank: tuple[torch.Tensor, ...], e: int) -> tuple[torch.Tensor, ...]:
        w_int, w_scale, group = _integer_weights(banks.format, tuple(t_[e:e + 1] for t_ in bank))
        dense = w_int[0] * w_scale[0].double().repeat_interleave(group, dim=-1)  # exact
        return w_int[0], w_scale[0], group, dense

    parts = []
    for e, sel in _experts(expert_ids):
        tok = token_ids[sel]
        gu_int, gu_scale, gu_group, gu_dense = expert(banks.gate_up, e)
        gu, gu_abs = _with_bias(_q8_matmul(xq[tok], xd[tok], gu_int, gu_scale, gu_group),
                                xdeq[tok].abs().double() @ gu_dense.abs().t(), gate_up_bias, e)
        act = expert_activation(gu, swiglu_limit, swiglu_alpha)  # [n, I]
        _, ad = quantize_q8_blocks(act)
        margin = act_margin(gu, gu_abs, swiglu_limit, swiglu_alpha)
        ambiguous, step = q8_alternatives(act, margin, ad, Q8_BLOCK)
        down = expert(banks.down, e)[3].float()
        parts.append(candidates_for(tok, weights[sel].float(), ambiguous, step, down))
    return RoundingCandidates.concat(parts, h)


def q8_accumulation_error(out: torch.Tensor, x: torch.Tensor, token_ids: torch.Tensor,
                          expert_ids: torch.Tensor, weights: torch.Tensor, banks,  # noqa: ANN001
                          **glu: object) -> float:
    """The kernel's ``activations="q8"`` output ``out [T, H]`` against ``cpu_moe_reference_q8``,
    up to rounding ambiguity: the error that ``Q8_ACCUMULATION_TOLERANCE`` bounds. ``glu``: the
    gpt-oss keywords (``gate_up_bias``, ``down_bias``, ``swiglu_limit``, ``swiglu_alpha``)."""
    from freetoken.ops.cpu_moe.reference_q8 import cpu_moe_reference_q8

    ref = cpu_moe_reference_q8(x, token_ids, expert_ids, weights, banks, **glu)
    cands = q8_rounding_candidates(x, token_ids, expert_ids, weights, banks,
                                   **_without_down_bias(glu))
    return relative_rms_error_up_to_rounding(ref, out, cands)


def bf16_accumulation_error(out: torch.Tensor, x: torch.Tensor, token_ids: torch.Tensor,
                            expert_ids: torch.Tensor, weights: torch.Tensor,
                            gate_up: torch.Tensor, down: torch.Tensor, **glu: object) -> float:
    """The kernel's ``activations="bf16"`` output ``out [T, H]`` against ``cpu_moe_reference(...,
    activations="bf16")``, up to rounding ambiguity: what ``BF16_ACCUMULATION_TOLERANCE`` bounds.
    ``glu``: the gpt-oss keywords, as in :func:`q8_accumulation_error`."""
    from freetoken.ops.cpu_moe.reference import cpu_moe_reference

    ref = cpu_moe_reference(x, token_ids, expert_ids, weights, gate_up, down, activations="bf16",
                            **glu)
    cands = bf16_rounding_candidates(x, token_ids, expert_ids, weights, gate_up, down,
                                     **_without_down_bias(glu))
    return relative_rms_error_up_to_rounding(ref, out, cands)


def _without_down_bias(glu: dict) -> dict:
    return {k: v for k, v in glu.items() if k != "down_bias"}
