"""Full (softmax) attention of Qwen3-MoE and the gated attention of Qwen3-Next.

Sources: transformers ``Qwen3MoeAttention`` and ``Qwen3NextAttention`` (model-architectures.md §3
and §1.5.2). Both: per-head RMSNorm of q and k over head_dim *before* RoPE, GQA, scale
``head_dim ** -0.5``, no bias. Qwen3-Next adds the output gate: ``q_proj`` yields per head
``[q_h | gate_h]`` and the attention output is multiplied by ``sigmoid(gate)`` before ``o_proj``;
it also rotates only the first ``rotary_dim`` dims and uses zero-centred q/k norms.

The q/k/v projections are fused into one ``[rows, H]`` weight at load time (rows ordered
``[q (nh*hd) | gate (nh*hd, gated only) | k (nkv*hd) | v (nkv*hd)]``), so a decode step is one
GEMV. Prefill of a chunk after ``start`` cached tokens uses SDPA with a ``[T, start+T]`` causal
offset mask; the caller bounds T so no ``[T_total, T_total]`` matrix is ever built.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from freetoken.models.config import ModelConfig
from freetoken.models.loader import WeightTarget
from freetoken.models.norms import RMSNorm
from freetoken.models.paged import PagedDecodeBatch, PagedKV
from freetoken.models.rotary import RotaryTable, apply_rotary
from freetoken.models.state import KVCache
from freetoken.ops.attention_decode import paged_decode_attention
from freetoken.ops.linear import cpu_kernel_fits, linear


@dataclass(frozen=True)
class AttnContext:
    """Per-chunk inputs shared by all attention layers.

    Attributes:
        start: tokens already cached (position of the chunk's first token).
        length: tokens in the chunk (T).
        cos, sin: ``[T, 1, rot/2]`` RoPE tables for positions ``start..start+T-1``.
        mask: ``[T, start+T]`` additive float mask (0 / -inf) or None when not needed.
        is_causal: True for a first chunk (``start == 0``, T > 1): plain causal SDPA.
        capture: offsets ``0 < o <= T`` inside the chunk where Gated DeltaNet layers snapshot
            their state (recurrent-state checkpoints at anchors without splitting the forward).
        snapshots: filled by the GDN layers, offset -> ``[conv, recurrent, conv, recurrent, ...]``
            in layer order (the order of ``DecoderLM.recurrent_tensors``).
    """

    start: int
    length: int
    cos: torch.Tensor
    sin: torch.Tensor
    mask: torch.Tensor | None
    is_causal: bool
    capture: tuple[int, ...] = ()
    snapshots: dict[int, list[torch.Tensor]] = field(default_factory=dict)

    @classmethod
    def build(cls, start: int, length: int, rotary: RotaryTable,
              dtype: torch.dtype, capture: tuple[int, ...] = ()) -> "AttnContext":
        """RoPE tables and the causal mask for a chunk of ``length`` tokens after ``start``;
        ``capture``: state snapshot offsets (see the class docstring)."""
        cos, sin = rotary.get(start, length, dtype)
        mask = None
        if start > 0 and length > 1:
            # all cached positions are visible; only the chunk's own block is causal
            mask = torch.zeros(length, start + length, dtype=dtype, device=cos.device)
            future = torch.ones(length, length, dtype=torch.bool, device=cos.device).triu(1)
            mask[:, start:].masked_fill_(future, float("-inf"))
        return cls(start, length, cos, sin, mask, start == 0 and length > 1, tuple(capture))


class Attention(nn.Module):
    """GQA attention with q/k RMSNorm and RoPE; ``gated=True`` for Qwen3-Next.

    GLM-4.5 (transformers ``Glm4MoeAttention``) adds q/k/v biases and makes the q/k norms
    optional (``config.attention_bias``, ``config.qk_norm``).

    Args:
        config: model config (heads, head_dim, rms_norm_eps, zero_centered_norms,
            attention_bias, qk_norm).
        gated: Qwen3-Next output gate (q_proj twice as wide, per-head ``[q | gate]``).
        dtype, device: parameter dtype/device.
    """

    def __init__(self, config: ModelConfig, gated: bool, dtype: torch.dtype, device=None) -> None:
        super().__init__()
        self.nh, self.nkv = config.num_attention_heads, config.num_key_value_heads
        self.hd = config.head_dim
        self.gated = gated
        self.q_rows = self.nh * self.hd * (2 if gated else 1)
        self.kv_rows = self.nkv * self.hd
        rows = self.q_rows + 2 * self.kv_rows
        self.qkv_weight = nn.Parameter(
            torch.empty(rows, config.hidden_size, dtype=dtype, device=device), requires_grad=False
        )
        self.o_weight = nn.Parameter(
            torch.empty(config.hidden_size, self.nh * self.hd, dtype=dtype, device=device),
            requires_grad=False,
        )
        self.qkv_bias = None
        if config.attention_bias:
            self.qkv_bias = nn.Parameter(torch.empty(rows, dtype=dtype, device=device),
                                         requires_grad=False)
        zc = config.zero_centered_norms
        self.q_norm = self.k_norm = None
        if config.qk_norm:
            self.q_norm = RMSNorm(self.hd, config.rms_norm_eps, zc, device)
            self.k_norm = RMSNorm(self.hd, config.rms_norm_eps, zc, device)
        self.scale = self.hd**-0.5

    def weight_targets(self, prefix: str) -> dict[str, WeightTarget]:
        """HF names under ``prefix`` (``model.layers.N.self_attn.``) -> slices of the fused weight.

        For the gated variant ``q_proj`` rows are re-ordered from per-head ``[q_h | gate_h]`` to
        ``[q_0..q_{nh-1} | gate_0..gate_{nh-1}]``.
        """
        q, kv = self.q_rows, self.kv_rows
        rows = None
        if self.gated:
            head = torch.arange(self.nh)[:, None] * 2 * self.hd
            within = torch.arange(self.hd)[None, :]
            rows = torch.cat([(head + within).flatten(), (head + self.hd + within).flatten()])
        targets = {
            prefix + "q_proj.weight": WeightTarget(self.qkv_weight[:q], rows),
            prefix + "k_proj.weight": WeightTarget(self.qkv_weight[q : q + kv]),
            prefix + "v_proj.weight": WeightTarget(self.qkv_weight[q + kv :]),
            prefix + "o_proj.weight": WeightTarget(self.o_weight),
        }
        if self.qkv_bias is not None:
            b = self.qkv_bias
            targets[prefix + "q_proj.bias"] = WeightTarget(b[:q], rows)
            targets[prefix + "k_proj.bias"] = WeightTarget(b[q : q + kv])
            targets[prefix + "v_proj.bias"] = WeightTarget(b[q + kv :])
        if self.q_norm is not None:
            targets.update(self.q_norm.weight_targets(prefix + "q_norm.weight"))
            targets.update(self.k_norm.weight_targets(prefix + "k_norm.weight"))
        return targets

    def forward(self, x: torch.Tensor, cache: KVCache, ctx: AttnContext) -> torch.Tensor:
        """Attend ``T`` new tokens to all cached ones and append their K/V to ``cache``.

        Args:
            x: ``[T, H]`` normed hidden states (model dtype).
            cache: this layer's KV cache (holds ``ctx.start`` tokens).
            ctx: positions / mask of the chunk.

        Returns:
            ``[T, H]`` attention output after ``o_proj``.
        """
        t = x.shape[0]
        qkv = linear(x, self.qkv_weight)
        if self.qkv_bias is not None:
            qkv = qkv + self.qkv_bias
        nq = self.nh * self.hd
        q = qkv[:, :nq].view(t, self.nh, self.hd)
        k = qkv[:, self.q_rows : self.q_rows + self.kv_rows].view(t, self.nkv, self.hd)
        v = qkv[:, self.q_rows + self.kv_rows :].view(t, self.nkv, self.hd)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rotary(q, ctx.cos, ctx.sin)
        k = apply_rotary(k, ctx.cos, ctx.sin)
        keys, values = cache.append(k, v)
        if t == 1:
            out = self._decode_attention(q[0], keys, values).to(x.dtype)
        else:
            out = F.scaled_dot_product_attention(
                q.transpose(0, 1).unsqueeze(0),
                keys.unsqueeze(0),
                values.unsqueeze(0),
                attn_mask=ctx.mask,
                is_causal=ctx.is_causal,
                scale=self.scale,
                enable_gqa=self.nh != self.nkv,
            )[0].transpose(0, 1).reshape(t, nq)
        if self.gated:
            out = out * torch.sigmoid(qkv[:, nq : 2 * nq])
        return linear(out, self.o_weight)

    def paged_decode_fits(self, x: torch.Tensor) -> bool:
        """Whether :meth:`forward_paged_decode` takes ``x [B, H]`` (CPU, fp32 / bf16 like the
        weights)."""
        return cpu_kernel_fits(x[:1], self.qkv_weight, self.o_weight)

    def decode_extras(self) -> dict:
        """Keyword arguments of :func:`~freetoken.ops.attention_decode.paged_decode_attention`
        (and fields of the decode stack's ``AttentionLayer``) beyond this layer's weights and
        head layout: none here (gpt-oss adds its sinks, window and o_proj bias)."""
        return {}

    def forward_paged_decode(self, h: torch.Tensor, norm: RMSNorm, caches: list[PagedKV],
                             batch: PagedDecodeBatch) -> torch.Tensor:
        """``h + self(norm(h))`` for one new token of each of ``B`` sequences in one C++ call
        (:func:`~freetoken.ops.attention_decode.paged_decode_attention`): the same math as
        :meth:`forward` per sequence, its K/V written into the pool and read there in place.

        Args:
            h: ``[B, H]`` residual stream (row ``b`` = sequence ``b``); norm: the layer's input
                norm.
            caches: this layer's :class:`PagedKV` of each sequence (one pool), each holding the
                positions before the new token; each grows by one.
            batch: the step's slot metadata (built from the same sequences, in order).

        Returns:
            ``[B, H]`` residual stream after the attention block, in ``h``'s dtype.
        """
        pool, layer = caches[0].pool, caches[0].layer
        norms = self.q_norm is not None
        out = paged_decode_attention(
            h.contiguous(), self.qkv_weight, self.o_weight,
            self.q_norm.scale() if norms else None, self.k_norm.scale() if norms else None,
            batch.cos, batch.sin, pool.k[layer], pool.v[layer], batch.kv_slots,
            batch.kv_offsets, num_heads=self.nh, num_kv_heads=self.nkv, gated=self.gated,
            eps=self.q_norm.eps if norms else 1e-6, scale=self.scale, input_norm=norm.scale(),
            input_eps=norm.eps,
            qkv_bias=None if self.qkv_bias is None else self.qkv_bias.float(),
            **self.decode_extras())
        for cache in caches:
            cache.length += 1
        return out if h.dtype == torch.float32 else out.to(h.dtype)

    def _decode_attention(self, q: torch.Tensor, keys: torch.Tensor,
                          values: torch.Tensor) -> torch.Tensor:
        """One query token against ``n`` cached ones, in fp32: ``q [nh, hd]``, ``keys`` /
        ``values [nkv, n, hd]`` -> ``[1, nh * hd]`` fp32.

        Query head ``h`` reads K/V head ``h // (nh / nkv)`` (GQA, as SDPA's ``enable_gqa``); two
        small batched matmuls and an fp32 softmax, far cheaper at decode than SDPA's CPU kernel.
        """
        group = self.nh // self.nkv
        qg = q.float().view(self.nkv, group, self.hd)  # [nkv, g, hd]
        scores = torch.bmm(qg, keys.float().transpose(1, 2)) * self.scale  # [nkv, g, n]
        probs = torch.softmax(scores, dim=-1)
        return torch.bmm(probs, values.float()).reshape(1, self.nh * self.hd)
