"""Temperature, top-k and top-p over the drawing rows ``[S, V]``, each row with its own values.

Each function computes, row for row, the same float32 values as the per-row reference in
:mod:`freetoken.engine.sampler` (``pick / temperature``, ``apply_top_k``, ``apply_top_p``), so a
seeded draw afterwards picks the same token. Two reductions are kept per row on an accelerator:
torch chooses its CUDA scan and top-k kernels by the number of rows as well as their length, so
a many-row ``cumsum`` can round differently, and a many-row ``topk`` can keep a different one of
two tied logits, than the one-row call the reference makes. On the CPU both kernels work row by
row, and one call covers all rows.

Shapes: S = drawing rows, V = vocabulary size; ``x`` is ``[S, V]`` float32 and owned by the
caller (the functions write into it).
"""

from __future__ import annotations

import torch

from freetoken.engine.sampling_rows import RowGroup


def scale_by_temperature(x: torch.Tensor, temperatures: torch.Tensor,
                         inverse_temperatures: torch.Tensor) -> torch.Tensor:
    """``x`` divided by each row's temperature, as a new ``[S, V]`` float32 tensor.

    Args:
        x: ``[S, V]`` float32 logits.
        temperatures: ``[S, 1]`` float32.
        inverse_temperatures: ``[S, 1]`` float32, ``1 / temperatures`` rounded on the CPU.
    """
    if x.device.type == "cuda":
        # CUDA divides by a Python scalar as a multiplication by its float32 reciprocal
        return x * inverse_temperatures
    return x / temperatures


def apply_top_k_rows(x: torch.Tensor, groups: tuple[RowGroup, ...]) -> torch.Tensor:
    """Keep exactly the ``k`` largest logits of each grouped row; the rest become ``-inf``.

    Args:
        x: ``[S, V]`` float32 logits (written in place).
        groups: rows sharing one ``k`` (``0 < k < V``); rows in no group are left alone.

    Returns:
        ``x`` (or a replacement when a group covers every row).
    """
    for group in groups:
        sub = x if group.full else x[group.rows]  # [n, V]
        idx = _topk_indices(sub, group.value)  # [n, k]
        kept = torch.full_like(sub, float("-inf")).scatter(-1, idx, sub.gather(-1, idx))
        if group.full:
            x = kept
        else:
            x[group.rows] = kept
    return x


def apply_top_p_rows(x: torch.Tensor, rows: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep, per listed row, the shortest most-likely prefix whose probability reaches ``p``.

    A token is dropped when the mass ranked strictly above it is already at least ``p``; the
    most likely token always stays (the reference's rule).

    Args:
        x: ``[S, V]`` float32 logits (written in place).
        rows: ``[P]`` long, the rows to filter.
        top_p: ``[P, 1]`` float32, each row's mass.

    Returns:
        ``x``, with the dropped tokens of the listed rows at ``-inf``.
    """
    if rows.numel() == 0:
        return x
    full = rows.numel() == x.shape[0]
    sub = x if full else x[rows]  # [P, V]
    probs = torch.softmax(sub, dim=-1)  # [P, V]
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)  # [P, V], [P, V]
    mass_before = _cumsum_rows(sorted_probs) - sorted_probs  # [P, V]
    drop_sorted = mass_before >= top_p
    drop_sorted[:, 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # vocab order
    kept = sub.masked_fill(drop, float("-inf"))
    if full:
        return kept
    x[rows] = kept
    return x


def topk_rows(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk(x, k)`` along the last dim, each row as the one-row call returns it.

    Args:
        x: ``[n, V]`` float tensor.
        k: ``1 <= k <= V``.

    Returns:
        ``values`` and ``indices``, both ``[n, k]`` (indices long), largest first.
    """
    if x.device.type == "cpu":
        out = torch.topk(x, k, dim=-1)
        return out.values, out.indices
    outs = [torch.topk(row, k) for row in x]
    return torch.stack([o.values for o in outs]), torch.stack([o.indices for o in outs])


def _topk_indices(x: torch.Tensor, k: int) -> torch.Tensor:
    return topk_rows(x, k)[1]


def _cumsum_rows(x: torch.Tensor) -> torch.Tensor:
    if x.device.type == "cpu":
        return torch.cumsum(x, dim=-1)
    return torch.stack([torch.cumsum(row, dim=-1) for row in x])
