"""The gated delta rule: recurrent form (decode, ground truth) and chunked form (prefill).

Math of model-architectures.md §2 (re-derived from fla ``naive.py`` and transformers
``torch_{recurrent,chunk}_gated_delta_rule``; checked in ``gdr_reference_check.py``). Per value
head, with fp32 state ``S [dk, dv]``, for each token t::

    S   = exp(g_t) * S                       # decay (g_t <= 0, log space)
    u   = beta_t * (v_t - S^T k_t)           # delta rule: correct what S predicts for k_t
    S   = S + k_t (x) u                      # rank-1 write
    o_t = S^T q_t                            # read after the write

Inputs of both functions: ``q, k [T, Hk, dk]`` already L2-normalised (``q`` also scaled by
``dk ** -0.5``), ``v [T, Hv, dv]``, ``g, beta [T, Hv]``, all fp32; grouped-value heads map
v-head ``j`` to k-head ``j // (Hv / Hk)``. ``state [Hv, dk, dv]`` fp32 is updated in place.
"""

from __future__ import annotations

import torch


def _expand_heads(x: torch.Tensor, num_v_heads: int) -> torch.Tensor:
    """``[T, Hk, d]`` -> ``[T, Hv, d]`` by repeating each k-head ``Hv/Hk`` times (GVA)."""
    ratio = num_v_heads // x.shape[1]
    return x if ratio == 1 else x.repeat_interleave(ratio, dim=1)


def recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> torch.Tensor:
    """Token-by-token gated delta rule (decode path; reference for the chunked form).

    Args:
        q, k: ``[T, Hk, dk]`` fp32 (normalised; q scaled).
        v: ``[T, Hv, dv]`` fp32.
        g: ``[T, Hv]`` fp32 log decay; beta: ``[T, Hv]`` fp32 write strength in (0, 1).
        state: ``[Hv, dk, dv]`` fp32, updated in place.

    Returns:
        ``[T, Hv, dv]`` fp32 outputs.
    """
    hv = v.shape[1]
    q, k = _expand_heads(q, hv), _expand_heads(k, hv)
    decay = g.exp()
    out = torch.empty_like(v)
    for t in range(v.shape[0]):
        kt = k[t].unsqueeze(1)  # [Hv, 1, dk]
        state.mul_(decay[t, :, None, None])
        predicted = torch.bmm(kt, state).squeeze(1)  # S^T k  [Hv, dv]
        delta = (v[t] - predicted) * beta[t, :, None]
        state.baddbmm_(kt.transpose(1, 2), delta.unsqueeze(1))
        out[t] = torch.bmm(q[t].unsqueeze(1), state).squeeze(1)
    return out


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    chunk_size: int = 64,
) -> torch.Tensor:
    """Chunked (WY / UT-transform) gated delta rule for prefill; same contract as the recurrent
    form.

    Per chunk of C tokens (T zero-padded to a multiple of C; padding has g = 0, beta = 0 and
    leaves the state unchanged), with ``c = cumsum(g)`` and ``D[i, j] = exp(c_i - c_j)`` for
    ``i >= j`` (0 above the diagonal)::

        A  = strictly_lower(beta_i k_i.k_j D_ij)
        solve (I + A) U = beta*V  and  (I + A) W = beta*K*exp(c)
        V' = U - W S;   O = (Q exp(c)) S + lower_incl(Q K^T * D) V'
        S  = exp(c_last) S + (K exp(c_last - c))^T V'

    The intra-chunk terms are computed for all chunks at once; only the state carry loops.

    Args:
        q, k, v, g, beta, state: as :func:`recurrent_gated_delta_rule`.
        chunk_size: C.

    Returns:
        ``[T, Hv, dv]`` fp32 outputs.
    """
    t_len, hv, dv = v.shape
    c = chunk_size
    pad = (-t_len) % c
    n = (t_len + pad) // c

    def chunks(x: torch.Tensor) -> torch.Tensor:  # [T, Hv, ...] -> [Hv, N, C, ...]
        if pad:
            x = torch.cat([x, x.new_zeros((pad,) + x.shape[1:])])
        return x.transpose(0, 1).reshape((hv, n, c) + x.shape[2:])

    q, k = chunks(_expand_heads(q, hv)), chunks(_expand_heads(k, hv))
    v, g, beta = chunks(v), chunks(g), chunks(beta)
    cum = g.cumsum(-1)  # [Hv, N, C]
    lower_incl = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~lower_incl, float("-inf")).exp()
    k_beta = k * beta[..., None]
    system = (k_beta @ k.transpose(-1, -2)) * decay  # diagonal is ignored by unitriangular solve
    u = torch.linalg.solve_triangular(system, v * beta[..., None], upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(
        system, k_beta * cum.exp()[..., None], upper=False, unitriangular=True
    )
    intra = (q @ k.transpose(-1, -2)) * decay  # [Hv, N, C, C], zero above the diagonal
    q_decayed = q * cum.exp()[..., None]
    last = cum[..., -1:]  # [Hv, N, 1]
    k_to_end = k * (last - cum).exp()[..., None]
    chunk_decay = last.exp()[..., None]  # [Hv, N, 1, 1]
    out = torch.empty(hv, n, c, dv, dtype=v.dtype, device=v.device)
    s = state
    for i in range(n):
        v_new = u[:, i] - w[:, i] @ s
        out[:, i] = q_decayed[:, i] @ s + intra[:, i] @ v_new
        s = s * chunk_decay[:, i] + k_to_end[:, i].transpose(-1, -2) @ v_new
    state.copy_(s)
    return out.reshape(hv, n * c, dv)[:, :t_len].transpose(0, 1)
