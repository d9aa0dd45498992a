"""Gated DeltaNet (linear attention) layer of Qwen3-Next.

Source: transformers ``Qwen3NextGatedDeltaNet`` (model-architectures.md §1.5.3). Steps: project
to q, k, v, z (gate), b, a; short causal depthwise conv + SiLU over ``[q | k | v]``; L2-normalise
q and k per head (eps 1e-6, fp32) and scale q by ``dk ** -0.5``; ``beta = sigmoid(b)``,
``g = -exp(A_log) * softplus(a + dt_bias)``; gated delta rule (§2) with grouped value heads;
gated RMSNorm with z; ``out_proj``.

Qwen3-Next checkpoints store ``in_proj_qkvz`` / ``in_proj_ba`` grouped by key head (per k-head
g: ``[q_g | k_g | v_g (r heads) | z_g (r heads)]`` and ``[b_g | a_g]``, r = Hv/Hk); Qwen3.5
stores plain ``in_proj_qkv`` (``[q | k | v]``), ``in_proj_z``, ``in_proj_b``, ``in_proj_a``
(transformers ``Qwen3_5GatedDeltaNet``). Either is loaded into one fused weight
``[q | k | v | z | b | a]``, so the conv input ``[q | k | v]`` is a contiguous slice of a single
GEMV output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from freetoken.models.config import ModelConfig
from freetoken.models.loader import WeightTarget
from freetoken.models.norms import RMSNorm, gated_rms_norm
from freetoken.models.state import GDNState
from freetoken.ops.causal_conv import causal_conv1d
from freetoken.ops.gated_delta_rule import chunk_gated_delta_rule, recurrent_gated_delta_rule
from freetoken.ops.gdn_decode import gdn_decode
from freetoken.ops.linear import cpu_kernel_fits, linear

L2_EPS = 1e-6


def l2_normalize(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """``scale * x * rsqrt(sum(x^2) + 1e-6)`` over the last dim in fp32 (fla / HF ``l2norm``).

    Computed as ``rms_norm(x, eps=1e-6/d) * d**-0.5`` (the same quantity, one fused kernel).
    """
    d = x.shape[-1]
    return F.rms_norm(x.float(), (d,), None, L2_EPS / d) * (scale * d**-0.5)


class GatedDeltaNet(nn.Module):
    """One Gated DeltaNet mixer.

    Args:
        config: Hk, Hv, dk, dv, conv width K, rms_norm_eps.
        dtype, device: projection/conv parameter dtype and device (A_log, dt_bias, norm: fp32).
        split_projections: the checkpoint stores Qwen3.5's four plain projections instead of
            Qwen3-Next's two grouped ones.
    """

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device=None,
                 split_projections: bool = False) -> None:
        super().__init__()
        self.split_projections = split_projections
        self.hk, self.hv = config.linear_num_key_heads, config.linear_num_value_heads
        self.dk, self.dv = config.linear_key_head_dim, config.linear_value_head_dim
        self.key_dim, self.value_dim = self.hk * self.dk, self.hv * self.dv
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.kernel = config.linear_conv_kernel_dim
        self.eps = config.rms_norm_eps
        rows = self.conv_dim + self.value_dim + 2 * self.hv

        def param(*shape: int, dt: torch.dtype = dtype) -> nn.Parameter:
            return nn.Parameter(torch.empty(*shape, dtype=dt, device=device), requires_grad=False)

        self.in_weight = param(rows, config.hidden_size)
        self.conv_weight = param(self.conv_dim, self.kernel)
        self.dt_bias = param(self.hv, dt=torch.float32)
        self.A_log = param(self.hv, dt=torch.float32)
        self.norm_weight = param(self.dv, dt=torch.float32)
        self.out_weight = param(config.hidden_size, self.value_dim)

    def _qkvz_rows(self) -> torch.Tensor:
        """Row order taking grouped ``in_proj_qkvz`` to ``[q | k | v | z]``."""
        r_dv = self.hv // self.hk * self.dv
        group = 2 * self.dk + 2 * r_dv
        base = torch.arange(self.hk)[:, None] * group

        def part(offset: int, width: int) -> torch.Tensor:
            return (base + offset + torch.arange(width)[None, :]).flatten()

        return torch.cat([part(0, self.dk), part(self.dk, self.dk),
                          part(2 * self.dk, r_dv), part(2 * self.dk + r_dv, r_dv)])

    def _ba_rows(self) -> torch.Tensor:
        """Row order taking grouped ``in_proj_ba`` to ``[b | a]``."""
        r = self.hv // self.hk
        base = torch.arange(self.hk)[:, None] * 2 * r
        within = torch.arange(r)[None, :]
        return torch.cat([(base + within).flatten(), (base + r + within).flatten()])

    def weight_targets(self, prefix: str) -> dict[str, WeightTarget]:
        """HF names under ``prefix`` (``model.layers.N.linear_attn.``) -> parameters."""
        qkvz = self.conv_dim + self.value_dim
        if self.split_projections:
            w, b = self.in_weight, qkvz + self.hv
            inputs = {
                prefix + "in_proj_qkv.weight": WeightTarget(w[: self.conv_dim]),
                prefix + "in_proj_z.weight": WeightTarget(w[self.conv_dim : qkvz]),
                prefix + "in_proj_b.weight": WeightTarget(w[qkvz:b]),
                prefix + "in_proj_a.weight": WeightTarget(w[b:]),
            }
        else:
            inputs = {
                prefix + "in_proj_qkvz.weight": WeightTarget(self.in_weight[:qkvz],
                                                             self._qkvz_rows()),
                prefix + "in_proj_ba.weight": WeightTarget(self.in_weight[qkvz:], self._ba_rows()),
            }
        return {
            **inputs,
            prefix + "conv1d.weight": WeightTarget(self.conv_weight.unsqueeze(1)),
            prefix + "dt_bias": WeightTarget(self.dt_bias),
            prefix + "A_log": WeightTarget(self.A_log),
            prefix + "norm.weight": WeightTarget(self.norm_weight),
            prefix + "out_proj.weight": WeightTarget(self.out_weight),
        }

    def new_state(self) -> GDNState:
        """Zero conv state ``[conv_dim, K-1]`` (param dtype), zero recurrent state ``[Hv, dk, dv]``
        (fp32)."""
        w = self.in_weight
        conv = torch.zeros(self.conv_dim, self.kernel - 1, dtype=w.dtype, device=w.device)
        recurrent = torch.zeros(self.hv, self.dk, self.dv, dtype=torch.float32, device=w.device)
        return GDNState(conv, recurrent)

    def forward(self, x: torch.Tensor, state: GDNState, ctx: object = None) -> torch.Tensor:
        """Mix ``T`` new tokens, carrying ``state`` (chunked rule for T > 1, recurrent for T = 1).

        Args:
            x: ``[T, H]`` normed hidden states (model dtype).
            state: this layer's conv/recurrent state, updated in place.
            ctx: the chunk's ``AttnContext`` or None; when it lists ``capture`` offsets, the
                delta rule runs segment by segment and the state after each offset's token is
                appended to ``ctx.snapshots[offset]`` (conv ``[conv_dim, K-1]``, recurrent
                ``[Hv, dk, dv]``; copies).

        Returns:
            ``[T, H]`` output after ``out_proj``.
        """
        t = x.shape[0]
        proj = linear(x, self.in_weight)
        c, vd = self.conv_dim, self.value_dim
        capture = getattr(ctx, "capture", ())
        conv_before = state.conv.clone() if capture else None
        mixed = F.silu(causal_conv1d(proj[:, :c], self.conv_weight, state.conv))
        z = proj[:, c : c + vd].reshape(t, self.hv, self.dv)
        b = proj[:, c + vd : c + vd + self.hv]
        a = proj[:, c + vd + self.hv :]
        q = l2_normalize(mixed[:, : self.key_dim].reshape(t, self.hk, self.dk), self.dk**-0.5)
        k = l2_normalize(mixed[:, self.key_dim : 2 * self.key_dim].reshape(t, self.hk, self.dk))
        v = mixed[:, 2 * self.key_dim :].reshape(t, self.hv, self.dv).float()
        beta = torch.sigmoid(b).float()
        g = -self.A_log.exp() * F.softplus(a.float() + self.dt_bias)
        if capture:
            core = self._segments(q, k, v, g, beta, state, proj[:, :c], conv_before, ctx)
        else:
            rule = recurrent_gated_delta_rule if t == 1 else chunk_gated_delta_rule
            core = rule(q, k, v, g, beta, state.recurrent)
        out = gated_rms_norm(core.to(x.dtype), z, self.norm_weight, self.eps)
        return linear(out.reshape(t, vd), self.out_weight)

    def decode_fits(self, x: torch.Tensor) -> bool:
        """Whether :meth:`forward_decode` takes ``x [B, H]`` (CPU, fp32 / bf16 like the
        projections)."""
        return cpu_kernel_fits(x[:1], self.in_weight, self.conv_weight, self.out_weight)

    def forward_decode(self, h: torch.Tensor, norm: RMSNorm,
                       states: list[GDNState]) -> torch.Tensor:
        """``h + self(norm(h))`` for one new token of each of ``B`` sequences in one C++ call
        (:func:`~freetoken.ops.gdn_decode.gdn_decode`): the same math as :meth:`forward` per
        sequence (recurrent form), each value it keeps in the model dtype rounded where it is.

        Args:
            h: ``[B, H]`` residual stream (row ``b`` = sequence ``b``); norm: the layer's input
                ``RMSNorm``.
            states: each sequence's state of this layer, updated in place.

        Returns:
            ``[B, H]`` residual stream after the block, in ``h``'s dtype.
        """
        out = gdn_decode(h.contiguous(), self.in_weight, self.conv_weight, self.dt_bias,
                         self.A_log, self.norm_weight, self.out_weight,
                         [s.conv for s in states], [s.recurrent for s in states],
                         num_k_heads=self.hk, num_v_heads=self.hv, eps=self.eps,
                         input_norm=norm.scale(), input_eps=norm.eps)
        return out if h.dtype == torch.float32 else out.to(h.dtype)

    def _segments(self, q, k, v, g, beta, state: GDNState, conv_in: torch.Tensor,
                  conv_before: torch.Tensor, ctx) -> torch.Tensor:
        """The delta rule split at ``ctx.capture`` offsets, snapshotting the state at each."""
        t = q.shape[0]
        outs, start = [], 0
        for end in sorted({*ctx.capture, t}):
            if end > start:
                rule = recurrent_gated_delta_rule if end - start == 1 else chunk_gated_delta_rule
                s = slice(start, end)
                outs.append(rule(q[s], k[s], v[s], g[s], beta[s], state.recurrent))
            if end in ctx.capture:
                if end == t:
                    snap = [state.conv.clone(), state.recurrent.clone()]
                else:  # the last K-1 conv inputs before position `end`
                    window = torch.cat([conv_before, conv_in[:end].t()], dim=1)
                    snap = [window[:, end : end + conv_before.shape[1]].clone(),
                            state.recurrent.clone()]
                ctx.snapshots.setdefault(end, []).extend(snap)
            start = end
        return outs[0] if len(outs) == 1 else torch.cat(outs)
