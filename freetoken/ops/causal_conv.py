"""Depthwise short causal conv1d with a carried state (Gated DeltaNet input conv).

Source: transformers ``causal_conv1d_fn`` / ``causal_conv1d_update`` torch fallbacks and
model-architectures.md §1.5.3: ``y[t, c] = sum_j w[c, j] * x[t - (K-1) + j, c]`` where inputs
before the sequence start come from the state (zeros for a new sequence). No bias, no activation
here (the caller applies SiLU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """Convolve ``T`` new steps and update the state in place.

    Args:
        x: ``[T, C]`` new inputs (model dtype).
        weight: ``[C, K]`` per-channel taps (same dtype).
        state: ``[C, K-1]`` previous K-1 inputs, oldest first; becomes the last K-1 inputs.

    Returns:
        ``[T, C]`` conv outputs (pre-activation), ``x``'s dtype.
    """
    t = x.shape[0]
    window = torch.cat([state, x.t()], dim=1)  # [C, K-1+T]
    if t == 1:
        y = (window * weight).sum(-1).unsqueeze(0)
    else:
        y = F.conv1d(window.unsqueeze(0), weight.unsqueeze(1), groups=weight.shape[0])[0].t()
    state.copy_(window[:, window.shape[1] - state.shape[1] :])
    return y
