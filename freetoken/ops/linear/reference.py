"""Plain-torch fp32 reference of :func:`freetoken.ops.linear.kernel_linear`."""

from __future__ import annotations

import torch


def linear_reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x [T, C] @ w [R, C]^T`` in fp32 (inputs upcast): ``[T, R]`` fp32."""
    return x.float() @ w.float().t()
