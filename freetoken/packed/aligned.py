"""Host tensors whose first byte is page aligned, so direct I/O can read straight into them."""

from __future__ import annotations

import math

import torch

PAGE = 4096


def aligned_empty(shape: tuple[int, ...], dtype: torch.dtype, align: int = PAGE) -> torch.Tensor:
    """An uninitialised contiguous CPU tensor of ``shape`` and ``dtype`` whose ``data_ptr()`` is a
    multiple of ``align`` (a view into a byte buffer ``align`` bytes longer: the allocator's own
    alignment is 64 bytes)."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    raw = torch.empty(nbytes + align, dtype=torch.uint8)
    skip = -raw.data_ptr() % align
    return raw[skip : skip + nbytes].view(dtype).view(shape)
