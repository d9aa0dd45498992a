"""Plain-torch reference of the kernel's int8-activation ("q8") path for 4-bit banks.

Shape letters: T tokens, H hidden, I expert intermediate, N flat expert ids, P triples, B = C / 32
blocks of a C-column vector. The activations entering each expert matrix (``x`` for ``gate_up``,
``silu(g) * u`` for ``down``) are quantised per block of 32 columns the way llama.cpp's Q8_0
does (``ggml-quants.c`` ``quantize_row_q8_0``; learnt from, not copied): ``d = absmax / 127``,
``q = round-half-even(v / d)`` clamped to ``[-127, 127]``. Each block's dot product with a 4-bit
weight row is then an exact integer sum of the weight integers (mxfp4: ``2 * e2m1`` in
``[-12, 12]`` with scale ``2^(s - 128)``; q4g: ``c - z`` with the fp16 scale) times ``q``, and
``out = sum over blocks of fp32(isum) * fp32(d * weight_scale)``: what ``csrc`` computes with
``activations="q8"`` (csrc/include/freetoken/q8.h), up to fp32 summation order.
"""

from __future__ import annotations

import torch

from freetoken.ops.cpu_moe.formats import ExpertBankView
from freetoken.ops.cpu_moe.quant import _e8m0_to_f32, _unpack_nibbles
from freetoken.ops.cpu_moe.reference import expert_activation

Q8_BLOCK = 32
# 2 * e2m1(code) for the 16 mxfp4 codes (bit 3 = sign).
_MXFP4_INT = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


def quantize_q8_blocks(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise ``v [..., C]`` to int8 per block of 32 columns (Q8_0 style), bit-equal to csrc.

    Per block: ``d = absmax / 127`` (fp32 division), ``q = round-half-even(v / d)`` (fp32
    division) clamped to ``[-127, 127]``; an all-zero block has ``d = 0`` and ``q = 0``; a block
    holding a NaN or an infinity gets ``d = NaN`` and ``q = 0`` (its dot products are NaN).

    Args:
        v: ``[..., C]`` float tensor (computed in fp32), C a multiple of 32.

    Returns:
        ``(q, d)``: int8 ``[..., C]`` and fp32 ``[..., C / 32]``.

    Raises:
        TypeError: ``v`` is not a floating-point tensor.
        ValueError: C is not a multiple of 32.
    """
    if not isinstance(v, torch.Tensor) or not v.is_floating_point():
        raise TypeError("quantize_q8_blocks: v must be a floating-point torch.Tensor")
    if v.dim() < 1 or v.shape[-1] % Q8_BLOCK != 0:
        raise ValueError(f"quantize_q8_blocks: the last dimension (size "
                         f"{v.shape[-1] if v.dim() else 0}) must be a multiple of {Q8_BLOCK}")
    blocks = v.float().reshape(*v.shape[:-1], v.shape[-1] // Q8_BLOCK, Q8_BLOCK)
    finite = torch.isfinite(blocks).all(-1)  # [..., B]
    amax = blocks.abs().amax(-1)
    d = torch.where(finite, amax / 127.0, torch.full_like(amax, float("nan")))
    ok = (finite & (amax > 0))[..., None]
    ratio = blocks / torch.where(ok, d[..., None], torch.ones_like(d[..., None]))
    q = torch.where(ok, torch.round(ratio).clamp(-127, 127), torch.zeros_like(ratio))
    return q.to(torch.int8).reshape(v.shape), d


def _integer_weights(fmt: str, tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """4-bit bank tensors ``[n, R, C]`` -> ``(w_int [n, R, C] float64, scale [n, R, C/G] fp32, G)``
    with ``weight = w_int * scale`` exactly (the kernel's in-block integers and group scales)."""
    if fmt == "mxfp4":
        blocks, scales = tensors
        codes = _unpack_nibbles(blocks).flatten(-2)  # [N, R, C]
        w_int = torch.tensor(_MXFP4_INT, dtype=torch.float64)[codes]
        # 2^(s - 127) / 2 = 2^(s - 128), exact for s >= 1; s = 0 halves the subnormal 2^-127.
        return w_int, _e8m0_to_f32(scales) / 2, Q8_BLOCK
    packed, scales = tensors[0], tensors[1]
    zeros = tensors[2] if len(tensors) > 2 else None
    codes = _unpack_nibbles(packed).double()  # [N, R, C]
    group = codes.shape[-1] // scales.shape[-1]
    z = 8.0 if zeros is None else zeros.double().repeat_interleave(group, dim=-1)
    return codes - z, scales.float(), group


def _q8_matmul(xq: torch.Tensor, xd: torch.Tensor, w_int: torch.Tensor, w_scale: torch.Tensor,
               group: int) -> torch.Tensor:
    """``[n, C]`` q8 activations times one expert matrix ``[R, C]``: ``[n, R]`` fp32.

    Block sums are exact (fp64 holds every integer sum), each is scaled by ``fp32(d * w_scale)``
    in fp32, and the blocks are summed in fp64 before the final rounding to fp32.
    """
    n, c = xq.shape
    r = w_int.shape[0]
    b = c // Q8_BLOCK
    xb = xq.double().reshape(n, b, Q8_BLOCK).transpose(0, 1)  # [B, n, 32]
    wb = w_int.reshape(r, b, Q8_BLOCK).permute(1, 2, 0)  # [B, 32, R]
    isum = torch.bmm(xb, wb).float()  # [B, n, R], exact integers
    wsb = w_scale.repeat_interleave(group // Q8_BLOCK, dim=-1).t()  # [B, R]
    scale = xd.t()[:, :, None] * wsb[:, None, :]  # [B, n, R] fp32
    return (isum * scale).double().sum(0).float()


def cpu_moe_reference_q8(
    x: torch.Tensor,
    token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    weights: torch.Tensor,
    banks: ExpertBankView,
    *,
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
    swiglu_limit: float | None = None,
    swiglu_alpha: float = 1.702,
) -> torch.Tensor:
    """The kernel's ``activations="q8"`` math in torch: gate-weighted SwiGLU expert outputs with
    both matrices' inputs quantised by :func:`quantize_q8_blocks`; the gpt-oss biases and
    activation are applied in fp32 around the quantised matrices, as in the kernel.

    Args:
        x: ``[T, H]`` hidden states (any float dtype; upcast to fp32).
        token_ids: ``[P]`` int64 token row of each triple, in ``[0, T)``.
        expert_ids: ``[P]`` int64 flat expert id of each triple, in ``[0, N)``; ``-1`` skips it.
        weights: ``[P]`` gate (top-k) weight of each triple.
        banks: 4-bit banks (``mxfp4`` or ``q4g``).
        gate_up_bias, down_bias, swiglu_limit, swiglu_alpha: the gpt-oss options of
            :func:`freetoken.ops.cpu_moe.reference.cpu_moe_reference` (``[N, 2I]``, ``[N, H]``
            fp32 or None; None / a limit ``> 0``; the sigmoid slope).

    Returns:
        ``[T, H]`` fp32 partial sums (zeros for tokens no triple names).

    Raises:
        ValueError: ``banks`` is not in a 4-bit format.
    """
    if banks.format not in ("mxfp4", "q4g"):
        raise ValueError(f"q8 activations need 4-bit expert banks (mxfp4 or q4g), got "
                         f"{banks.format}")
    t, h = x.shape
    xq, xd = quantize_q8_blocks(x.float())
    out = torch.zeros(t, h, dtype=torch.float32)
    for e in torch.unique(expert_ids[expert_ids >= 0]).tolist():
        sel = (expert_ids == e).nonzero().flatten()  # [n]
        tok = token_ids[sel]  # [n]
        gu_int, gu_scale, gu_group = _integer_weights(
            banks.format, tuple(t_[e:e + 1] for t_ in banks.gate_up))
        gu = _q8_matmul(xq[tok], xd[tok], gu_int[0], gu_scale[0], gu_group)  # [n, 2I]
        if gate_up_bias is not None:
            gu = gu + gate_up_bias[e].float()
        act = expert_activation(gu, swiglu_limit, swiglu_alpha)  # [n, I]
        aq, ad = quantize_q8_blocks(act)
        dn_int, dn_scale, dn_group = _integer_weights(
            banks.format, tuple(t_[e:e + 1] for t_ in banks.down))
        y = _q8_matmul(aq, ad, dn_int[0], dn_scale[0], dn_group)  # [n, H]
        if down_bias is not None:
            y = y + down_bias[e].float()
        out.index_add_(0, tok, y * weights[sel].float()[:, None])
    return out
