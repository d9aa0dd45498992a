"""Rotary position embedding (NeoX ``rotate_half`` form) with partial rotary support.

Source: transformers ``Qwen3NextRotaryEmbedding`` / ``apply_rotary_pos_emb`` (model-architectures.md
§1.5.2): ``inv_freq = theta ** (-arange(0, rot, 2) / rot)`` in fp32, angle ``pos * inv_freq``, and
for the first ``rot`` dims ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) =
cat(-x2, x1)``; dims past ``rot`` pass through. Written here with half-width tables:
``(x1 cos - x2 sin, x2 cos + x1 sin)``, the same products and sums. With YaRN (gpt-oss) the
frequencies blend interpolated and extrapolated ones over a ramp of dims and cos / sin carry the
attention factor (:func:`yarn_inv_freq`).
"""

from __future__ import annotations

import math

import torch

from freetoken.models.config_gpt_oss import YarnRope


def yarn_inv_freq(rotary_dim: int, theta: float, yarn: YarnRope) -> torch.Tensor:
    """YaRN inverse frequencies ``[rot/2]`` fp32 (Peng et al. 2023, §3.2 "NTK-by-parts").

    Dim pair ``i`` keeps its frequency ``theta^(-2i/rot)`` where a wavelength fits the original
    context many times (more than ``beta_fast`` rotations), is divided by ``factor`` where it
    fits fewer than ``beta_slow`` times, and blends linearly in between.
    """
    def dim_of(rotations: float) -> float:
        return (rotary_dim * math.log(yarn.original_max_positions / (rotations * 2 * math.pi))
                / (2 * math.log(theta)))

    low, high = dim_of(yarn.beta_fast), dim_of(yarn.beta_slow)
    if yarn.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    base = theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)
    keep = 1 - ramp
    return (1.0 / (yarn.factor * base)) * (1 - keep) + (1.0 / base) * keep


class RotaryTable:
    """Cached cos/sin of every position seen so far, grown by doubling.

    Args:
        rotary_dim: rotated dims ``rot`` (even).
        theta: RoPE base.
        device: where the tables live.
        yarn: YaRN scaling, or None.
    """

    def __init__(self, rotary_dim: int, theta: float, device=None,
                 yarn: YarnRope | None = None) -> None:
        exponent = torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim
        self.inv_freq = 1.0 / (theta**exponent)  # fp32, on CPU like HF's buffer before .to()
        self.scale = 1.0
        if yarn is not None:
            self.inv_freq = yarn_inv_freq(rotary_dim, theta, yarn)
            self.scale = yarn.attention_factor
        self.device = device
        self._cos = torch.empty(0, rotary_dim // 2)
        self._sin = torch.empty(0, rotary_dim // 2)

    def _grow(self, length: int) -> None:
        size = max(length, 2 * self._cos.shape[0], 256)
        pos = torch.arange(size, dtype=torch.float32)
        angles = pos[:, None] * self.inv_freq[None, :]
        cos, sin = angles.cos(), angles.sin()
        if self.scale != 1.0:
            cos, sin = cos * self.scale, sin * self.scale
        self._cos, self._sin = cos.to(self.device), sin.to(self.device)

    def get(self, start: int, length: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for positions ``start .. start+length-1``.

        Returns:
            two ``[length, 1, rot/2]`` tensors in ``dtype`` (broadcast over heads).
        """
        if start + length > self._cos.shape[0]:
            self._grow(start + length)
        cos = self._cos[start : start + length, None, :].to(dtype)
        sin = self._sin[start : start + length, None, :].to(dtype)
        return cos, sin


    def at(self, positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 cos, sin at each of ``positions``: two ``[len(positions), rot/2]`` tensors."""
        end = max(positions) + 1
        if end > self._cos.shape[0]:
            self._grow(end)
        if len(positions) == 1:  # a view of the row: one decode step, no gather
            p = positions[0]
            return self._cos[p : p + 1], self._sin[p : p + 1]
        index = torch.tensor(positions, device=self._cos.device)
        return self._cos.index_select(0, index), self._sin.index_select(0, index)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``2 * cos.shape[-1]`` dims of every head.

    Args:
        x: ``[T, heads, head_dim]``.
        cos, sin: ``[T, 1, rot/2]`` from :meth:`RotaryTable.get`, same dtype as ``x``.

    Returns:
        ``[T, heads, head_dim]`` new tensor.
    """
    half = cos.shape[-1]
    x1, x2 = x[..., :half], x[..., half : 2 * half]
    parts = [x1 * cos - x2 * sin, x2 * cos + x1 * sin]
    if x.shape[-1] > 2 * half:
        parts.append(x[..., 2 * half :])
    return torch.cat(parts, dim=-1)
