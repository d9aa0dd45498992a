"""Plain-torch fp32 reference of :func:`freetoken.ops.gdn_decode.gdn_decode`."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from freetoken.ops.gated_delta_rule import recurrent_gated_delta_rule


def _l2(t: torch.Tensor) -> torch.Tensor:
    """``t / sqrt(sum(t^2) + 1e-6)`` over the last dim (fla / HF ``l2norm``)."""
    return t * torch.rsqrt((t * t).sum(-1, keepdim=True) + 1e-6)


def gdn_decode_reference(x, in_w, conv_w, dt_bias, a_log, norm_w, out_w,
                         conv_states: list[torch.Tensor], recurrent: list[torch.Tensor],
                         num_k_heads: int, num_v_heads: int, eps: float,
                         input_norm: torch.Tensor | None = None,
                         input_eps: float = 1e-6) -> torch.Tensor:
    """Same arguments and effect as the kernel (each sequence's conv / recurrent state updated
    in place), in fp32 from the upcast inputs (the conv state keeps its dtype). Returns
    ``[B, H]`` fp32."""
    if input_norm is not None:
        h = x.float()
        x = F.rms_norm(h, (h.shape[1],), input_norm.float(), input_eps)
        return h + gdn_decode_reference(x, in_w, conv_w, dt_bias, a_log, norm_w, out_w,
                                        conv_states, recurrent, num_k_heads, num_v_heads, eps)
    hv, dv = num_v_heads, norm_w.shape[0]
    conv_dim, k = conv_w.shape
    vd = hv * dv
    key_dim = (conv_dim - vd) // 2
    dk = key_dim // num_k_heads
    proj = x.float() @ in_w.float().t()
    outs = []
    for b, (conv, state) in enumerate(zip(conv_states, recurrent)):
        row = proj[b]
        window = torch.cat([conv.float(), row[:conv_dim, None]], dim=1)  # [conv_dim, K]
        conv.copy_(window[:, 1:].to(conv.dtype))
        mixed = F.silu((window * conv_w.float()).sum(-1))
        q = mixed[:key_dim].reshape(1, num_k_heads, dk)
        kk = mixed[key_dim:2 * key_dim].reshape(1, num_k_heads, dk)
        q = _l2(q) * dk**-0.5
        kk = _l2(kk)
        v = mixed[2 * key_dim:].reshape(1, hv, dv)
        z = row[conv_dim:conv_dim + vd].reshape(hv, dv)
        beta = torch.sigmoid(row[conv_dim + vd:conv_dim + vd + hv]).reshape(1, hv)
        g = (-a_log.float().exp() * F.softplus(row[conv_dim + vd + hv:] + dt_bias)).reshape(1, hv)
        core = recurrent_gated_delta_rule(q, kk, v, g, beta, state)[0]  # [hv, dv]
        y = F.rms_norm(core, (dv,), norm_w.float(), eps) * F.silu(z)
        outs.append(y.reshape(vd) @ out_w.float().t())
    return torch.stack(outs)
