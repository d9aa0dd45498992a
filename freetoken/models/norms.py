"""RMSNorm variants of the Qwen3 families.

Sources: transformers ``Qwen3MoeRMSNorm`` (``w * rms(x)``), ``Qwen3NextRMSNorm`` (zero-centred,
``(1 + w) * rms(x)`` computed in fp32 then cast) and ``Qwen3NextRMSNormGated`` (``w * rms(x) *
silu(z)``), summarised in model-architectures.md §1.5.1 and §3. Weights are kept in fp32 (they
are tiny); results come back in the input dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from freetoken.models.loader import WeightTarget


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``x * rsqrt(mean(x^2) + eps)`` over the last dim, in fp32."""
    x32 = x.float()
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    """RMSNorm over the last dim.

    ``zero_centered=False`` (Qwen3-MoE): ``w * rms(x).to(dtype)``, w stored around 1.
    ``zero_centered=True`` (Qwen3-Next): ``(rms(x) * (1 + w)).to(dtype)``, w stored around 0.

    Args:
        dim: normalised width (H, or head_dim for q_norm/k_norm).
        eps: added to the mean square.
        zero_centered: which of the two forms above.
    """

    def __init__(self, dim: int, eps: float, zero_centered: bool, device=None) -> None:
        super().__init__()
        self.eps = eps
        self.zero_centered = zero_centered
        self.weight = nn.Parameter(torch.empty(dim, device=device), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., dim]`` -> same shape and dtype."""
        if self.zero_centered:
            return (_rms(x, self.eps) * (1.0 + self.weight)).to(x.dtype)
        return (self.weight * _rms(x, self.eps).to(x.dtype)).to(x.dtype)

    def weight_targets(self, name: str) -> dict[str, WeightTarget]:
        """``{name: weight}`` (``name`` is the full HF tensor name)."""
        return {name: WeightTarget(self.weight)}


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gated RMSNorm of the Gated DeltaNet output (``Qwen3NextRMSNormGated``).

    Args:
        x: ``[..., dv]`` core output (any float dtype).
        z: ``[..., dv]`` gate, same shape.
        weight: ``[dv]`` fp32 plain scale (stored around 1).
        eps: RMS epsilon.

    Returns:
        ``weight * rms(x) * silu(z)`` in ``x``'s dtype (norm before gate, gate in fp32).
    """
    y = weight * _rms(x, eps).to(x.dtype)
    return (y * F.silu(z.float())).to(x.dtype)
