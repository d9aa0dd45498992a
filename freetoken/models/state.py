"""Per-sequence caches: the KV cache of full-attention layers and the Gated DeltaNet state.

Shapes follow model-architectures.md §1.6: per full-attention layer K and V of every past token
(kept here as ``[nkv, capacity, head_dim]`` so the first ``n`` positions are a strided view ready
for ``scaled_dot_product_attention``); per GDN layer the conv state ``[conv_dim, K-1]`` (model
dtype, the last K-1 pre-conv inputs) and the recurrent state ``[Hv, dk, dv]`` in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from freetoken.models.base import SequenceState


class KVCache:
    """Growing K/V storage of one attention layer.

    Capacity doubles when full (amortised O(1) copy per token, no per-step re-concatenation).

    Args:
        num_kv_heads, head_dim: per-token K/V shape ``[nkv, head_dim]``.
        dtype, device: storage dtype/device (the model's compute dtype).
        capacity: initial number of token slots.
    """

    def __init__(self, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device=None,
                 capacity: int = 256) -> None:
        self.length = 0
        self.k = torch.empty(num_kv_heads, capacity, head_dim, dtype=dtype, device=device)
        self.v = torch.empty_like(self.k)

    @property
    def capacity(self) -> int:
        """Token slots currently allocated."""
        return self.k.shape[1]

    def _reserve(self, needed: int) -> None:
        if needed <= self.capacity:
            return
        size = max(needed, 2 * self.capacity)
        for name in ("k", "v"):
            old = getattr(self, name)
            new = old.new_empty(old.shape[0], size, old.shape[2])
            new[:, : self.length] = old[:, : self.length]
            setattr(self, name, new)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``T`` new positions and return all cached K, V.

        Args:
            k, v: ``[T, nkv, head_dim]`` (already rotated K).

        Returns:
            ``(K, V)``, each a ``[nkv, length, head_dim]`` view of the cache (valid until the next
            append).
        """
        t = k.shape[0]
        self._reserve(self.length + t)
        end = self.length + t
        self.k[:, self.length : end] = k.transpose(0, 1)
        self.v[:, self.length : end] = v.transpose(0, 1)
        self.length = end
        return self.k[:, :end], self.v[:, :end]


@dataclass
class GDNState:
    """Gated DeltaNet state of one layer.

    Attributes:
        conv: ``[conv_dim, K-1]`` last K-1 inputs of the short causal conv (model dtype).
        recurrent: ``[Hv, dk, dv]`` fp32 delta-rule memory ``S`` (``o_t = S^T q_t``).
    """

    conv: torch.Tensor
    recurrent: torch.Tensor


class HybridState(SequenceState):
    """State of one sequence in a hybrid (attention + Gated DeltaNet) or attention-only model.

    Attributes:
        num_tokens: tokens consumed so far (the next token's position).
        layers: per decoder layer a :class:`KVCache` or a :class:`GDNState`.
    """

    def __init__(self, layers: list[KVCache | GDNState]) -> None:
        self.num_tokens = 0
        self.layers = layers
