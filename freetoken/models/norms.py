"""RMSNorm variants of the Qwen3 families.

Sources: transformers ``Qwen3MoeRMSNorm`` (``w * rms(x)``), ``Qwen3NextRMSNorm`` (zero-centred,
``(1 + w) * rms(x)`` computed in fp32 then cast) and ``Qwen3NextRMSNormGated`` (``w * rms(x) *
silu(z)``), summarised in model-architectures.md §1.5.1 and §3, with
``rms(x) = x * rsqrt(mean(x^2) + eps)``. Computed with the fused ``F.rms_norm`` in fp32 (bit-equal
to the unfused formula at fp32); weights are kept in fp32 and results come back in the input
dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from freetoken.models.loader import WeightTarget


class RMSNorm(nn.Module):
    """RMSNorm over the last dim.

    ``zero_centered=False`` (Qwen3-MoE): ``w * rms(x)``, w stored around 1.
    ``zero_centered=True`` (Qwen3-Next): ``(1 + w) * rms(x)``, w stored around 0.

    Args:
        dim: normalised width (H, or head_dim for q_norm/k_norm).
        eps: added to the mean square.
        zero_centered: which of the two forms above.
    """

    def __init__(self, dim: int, eps: float, zero_centered: bool, device=None) -> None:
        super().__init__()
        self.eps = eps
        self.shape = (dim,)
        self.zero_centered = zero_centered
        self.weight = nn.Parameter(torch.empty(dim, device=device), requires_grad=False)
        self._scale: torch.Tensor | None = None
        self._scale_version = -1

    def scale(self) -> torch.Tensor:
        """The fp32 multiplier ``1 + w`` or ``w``, recomputed only when the weight changed."""
        if self._scale is None or self._scale_version != self.weight._version:
            with torch.inference_mode(False), torch.no_grad():
                weight = self.weight.detach()
                self._scale = weight + 1.0 if self.zero_centered else weight.clone()
            self._scale_version = self.weight._version
        return self._scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., dim]`` -> same shape and dtype."""
        return F.rms_norm(x.float(), self.shape, self.scale(), self.eps).to(x.dtype)

    def weight_targets(self, name: str) -> dict[str, WeightTarget]:
        """``{name: weight}`` (``name`` is the full HF tensor name)."""
        return {name: WeightTarget(self.weight)}


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor,
                   eps: float) -> torch.Tensor:
    """Gated RMSNorm of the Gated DeltaNet output (``Qwen3NextRMSNormGated``).

    Args:
        x: ``[..., dv]`` core output (any float dtype).
        z: ``[..., dv]`` gate, same shape.
        weight: ``[dv]`` fp32 plain scale (stored around 1).
        eps: RMS epsilon.

    Returns:
        ``weight * rms(x) * silu(z)`` in ``x``'s dtype (norm before gate, gate in fp32).
    """
    y = F.rms_norm(x.float(), (x.shape[-1],), weight, eps)
    return (y * F.silu(z.float())).to(x.dtype)
