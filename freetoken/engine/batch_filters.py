"""Temperature, top-k and top-p over the drawing rows ``[S, V]``, each row with its own values.

Each function computes, row for row, the same float32 values as the per-row reference in
:mod:`freetoken.engine.sampler` (``pick / temperature``, ``apply_top_k``, ``apply_top_p``), so a
seeded draw afterwards picks the same token. Rows come in :class:`RowGroup` s of one value, and
each group is one operation with that value as a Python scalar, exactly the reference's
operation. Two reductions stay one call per row on an accelerator: torch picks its CUDA scan
kernel (a device-wide scan for one row, a per-row kernel for many) and its top-k kernel by the
shape, so a many-row ``cumsum`` can round differently, and a many-row ``topk`` can keep a
different one of two tied logits, than the one-row call the reference makes. On the CPU both kernels work row by row, and one call covers
all rows; there top-p also avoids sorting a row's whole vocabulary when its nucleus ends among
its first :data:`TOP_P_HEAD` tokens (:func:`_nucleus_in_head`), with the same result.

Shapes: S = drawing rows, V = vocabulary size. ``x`` is ``[S, V]`` float32; a group that covers
only some rows is written into ``x`` in place, so the caller passes a copy it owns then
(:attr:`SamplingRows.writes_rows`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from freetoken.engine.sampling_rows import RowGroup

TOP_P_HEAD = 1024
"""Most likely tokens top-p looks at before sorting a whole CPU row: a sort of 151,936
probabilities costs about ten times a top-1024 (measured on 2 cores, 8 rows: 10.8 vs 1.1 ms),
and a nucleus after a top-k, or of a confident model, ends inside it."""


def scale_by_temperature(x: torch.Tensor, groups: tuple[RowGroup, ...]) -> torch.Tensor:
    """Divide each grouped row of ``x`` by its group's temperature.

    Args:
        x: ``[S, V]`` float32 logits.
        groups: rows by temperature (rows at temperature 1 are in none).

    Returns:
        The scaled ``[S, V]`` logits (a new tensor when a group covers every row).
    """
    return _per_group(x, groups, lambda sub, t: sub / t)


def apply_top_k_rows(x: torch.Tensor, groups: tuple[RowGroup, ...]) -> torch.Tensor:
    """Keep exactly the ``k`` largest logits of each grouped row; the rest become ``-inf``.

    Args:
        x: ``[S, V]`` float32 logits.
        groups: rows by ``k`` (``0 < k < V``); rows in no group are left alone.

    Returns:
        The filtered ``[S, V]`` logits. Ties at the k-th value are broken as ``torch.topk``
        breaks them for the row alone.
    """
    return _per_group(x, groups, _top_k)


def apply_top_p_rows(x: torch.Tensor, groups: tuple[RowGroup, ...]) -> torch.Tensor:
    """Keep, per grouped row, the shortest most-likely prefix whose probability reaches ``p``.

    A token is dropped when the mass ranked strictly above it is already at least ``p``; the
    most likely token always stays (the reference's rule).

    Args:
        x: ``[S, V]`` float32 logits.
        groups: rows by ``p`` (``p < 1``); rows in no group are left alone.

    Returns:
        The filtered ``[S, V]`` logits.
    """
    return _per_group(x, groups, _top_p)


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


def _per_group(x: torch.Tensor, groups: tuple[RowGroup, ...],
               fn: Callable[[torch.Tensor, float], torch.Tensor]) -> torch.Tensor:
    for group in groups:
        if group.full:
            x = fn(x, group.value)
        else:
            x[group.rows] = fn(x[group.rows], group.value)
    return x


def _top_k(x: torch.Tensor, k: float) -> torch.Tensor:
    idx = topk_rows(x, int(k))[1]  # [n, k]
    return torch.full_like(x, float("-inf")).scatter(-1, idx, x.gather(-1, idx))


def _top_p(x: torch.Tensor, p: float) -> torch.Tensor:
    probs = torch.softmax(x, dim=-1)  # [n, V]
    if x.device.type != "cpu" or x.shape[-1] <= TOP_P_HEAD:
        return x.masked_fill(_dropped_by_sort(probs, p), float("-inf"))
    kept, decided = _nucleus_in_head(probs, p)  # [n, V], [n]
    out = x.masked_fill(~kept, float("-inf"))
    undecided = (~decided).nonzero().flatten().tolist()  # a host read: CPU tensors only
    if undecided:
        rows = torch.tensor(undecided)
        out[rows] = x[rows].masked_fill(_dropped_by_sort(probs[rows], p), float("-inf"))
    return out


def _dropped_by_sort(probs: torch.Tensor, p: float) -> torch.Tensor:
    """``[n, V]`` bool, the tokens top-p drops, from a sort of whole rows (the reference's
    way)."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)  # [n, V], [n, V]
    mass_before = _cumsum_rows(sorted_probs) - sorted_probs  # [n, V]
    drop_sorted = mass_before >= p
    drop_sorted[:, 0] = False
    return torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # vocab order


def _nucleus_in_head(probs: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens top-p keeps, decided from the ``TOP_P_HEAD`` most likely tokens of each row
    without sorting the rest, and which rows that decides.

    The head's sorted values and their running sums are the first ``TOP_P_HEAD`` of the full
    sort's (the CPU ``cumsum`` adds in order), so the head's drop flags are the reference's.
    Past the head every token is dropped when the head's last one is: its mass before is at
    least the last head token's. Which of several equal probabilities the full sort puts first
    is not reproduced (torch's CPU sort is not stable), so a row is decided only when its head
    does not split a run of equal values between kept and dropped; bf16 logits make such runs
    common.

    Returns:
        ``kept``: ``[n, V]`` bool, valid in decided rows; ``decided``: ``[n]`` bool.
    """
    values, ids = torch.topk(probs, TOP_P_HEAD, dim=-1)  # [n, H] descending, [n, H]
    mass_before = torch.cumsum(values, dim=-1) - values  # [n, H]
    drop = mass_before >= p
    drop[:, 0] = False
    split_tie = (values[:, 1:] == values[:, :-1]) & (drop[:, 1:] != drop[:, :-1])  # [n, H-1]
    decided = drop[:, -1] & ~split_tie.any(dim=-1)
    kept = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, ids, ~drop)
    return kept, decided


def _cumsum_rows(x: torch.Tensor) -> torch.Tensor:
    if x.device.type == "cpu":
        return torch.cumsum(x, dim=-1)
    return torch.stack([torch.cumsum(row, dim=-1) for row in x])
