"""Next-token sampling for a whole step: ``[R, V]`` logits in, one token (and logprobs) per row.

The batched form of :func:`freetoken.engine.sampler.sample` (the per-row reference), with the
same results row for row: greedy rows take one argmax over all of them; drawing rows are
scaled by their own temperature, filtered by their own top-k then top-p
(:mod:`freetoken.engine.batch_filters`) and drawn each from its own generator
(:mod:`freetoken.engine.seeded_draw`); logprobs come from the raw logits' ``log_softmax``, one
``topk`` per distinct alternatives count. Everything the caller needs (ids, logprobs, top
alternatives, validity) is packed into one float64 tensor and read back with a single
``tolist()``: float64 holds every token id and every float32 logprob exactly.

Where the result depends on a torch kernel's choice rather than on arithmetic (CUDA scan and
top-k kernels, the multinomial's internals), the modules above keep the reference's per-row
call or check the equivalence first. What stays per row by nature: each drawing row's random
values come from its own generator (spread over threads on the CPU), and each distinct
parameter value (temperature, top-k, top-p, alternatives count) is one operation over its rows.
The CUDA paths follow torch's kernels as written but have not been run against the reference.

Shapes: R = sampling rows, S = drawing rows, L = logprob rows, V = vocabulary size.
"""

from __future__ import annotations

import torch

from freetoken.engine.batch_filters import (apply_top_k_rows, apply_top_p_rows,
                                            scale_by_temperature, topk_rows)
from freetoken.engine.sampler import SampledToken
from freetoken.engine.sampling_rows import SamplingRows
from freetoken.engine.seeded_draw import draw_rows, invalid_rows

INVALID_PROBS = "probability tensor contains either `inf`, `nan` or element < 0"
"""The error a row with invalid probabilities raises (``torch.multinomial``'s own words)."""


def sample_batch(logits: torch.Tensor, rows: SamplingRows,
                 allowed: torch.Tensor | None = None,
                 raw_logits: torch.Tensor | None = None) -> list[SampledToken]:
    """Pick the next token of every row of ``logits``.

    Args:
        logits: ``[R, V]`` logits to pick from (any float dtype; the math runs in float32).
        rows: the rows' parameters (:meth:`SamplingRows.build` over the same R rows and V).
        allowed: ``[R, V]`` bool, the only ids each row may pick (grammar-constrained rows; all
            True for the others), or None; the others are set to ``-inf`` before the
            temperature / top-k / top-p chain, and logprobs ignore the mask.
        raw_logits: ``[R, V]`` logits the logprobs are taken from when ``logits`` were changed
            (``logit_bias``); None takes them from ``logits``.

    Returns:
        One :class:`SampledToken` per row, in row order, with raw logprobs where asked.

    Raises:
        RuntimeError: a drawing row's probabilities are NaN (a NaN or infinite logit), as
            ``torch.multinomial`` raises for it.
    """
    if rows.num_rows == 0:
        return []
    logits = logits.float()
    raw = logits if raw_logits is None else raw_logits.float()
    pick = logits if allowed is None else logits.masked_fill(~allowed, float("-inf"))
    ids, invalid = _pick(pick, rows)  # [R], [S] or None
    parts = [ids.to(torch.float64)]
    if invalid is not None:
        parts.append(invalid.to(torch.float64))
    if rows.num_logprob_rows:
        parts.extend(_logprob_parts(raw, ids, rows))
    values = torch.cat(parts).tolist()  # the step's only device -> host transfer
    return _unpack(values, rows, invalid is not None)


def _pick(pick: torch.Tensor, rows: SamplingRows) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[R]`` long ids (argmax for greedy rows, a seeded draw for the others) and the drawn
    rows' ``[S]`` bool invalid flags (None when no row draws)."""
    if rows.num_greedy == rows.num_rows:
        return torch.argmax(pick, dim=-1), None
    mixed = rows.drawn is not None
    x = pick[rows.drawn] if mixed else pick  # [S, V]
    if x is pick and rows.writes_rows:
        x = x.clone()  # some filter writes into only some rows: not into the caller's logits
    x = scale_by_temperature(x, rows.temperature)
    x = apply_top_k_rows(x, rows.top_k)
    x = apply_top_p_rows(x, rows.top_p)
    probs = torch.softmax(x, dim=-1)  # [S, V]
    drawn = draw_rows(probs, rows.generators)  # [S]
    invalid = invalid_rows(probs, drawn)  # [S]
    if not mixed:
        return drawn, invalid
    ids = torch.empty(rows.num_rows, dtype=torch.long, device=pick.device)
    ids[rows.drawn] = drawn
    ids[rows.greedy] = torch.argmax(pick[rows.greedy], dim=-1)
    return ids, invalid


def _logprob_parts(raw: torch.Tensor, ids: torch.Tensor,
                   rows: SamplingRows) -> list[torch.Tensor]:
    """float64 pieces for the transfer: the L chosen logprobs, then per top-logprobs group its
    ``[n, k]`` ids and ``[n, k]`` values, flattened."""
    some = rows.logprob_rows is not None
    lp = torch.log_softmax(raw[rows.logprob_rows] if some else raw, dim=-1)  # [L, V]
    chosen_ids = ids[rows.logprob_rows] if some else ids  # [L]
    parts = [lp.gather(-1, chosen_ids.unsqueeze(-1)).squeeze(-1).to(torch.float64)]  # [L]
    for group in rows.top_logprobs:
        values, top_ids = topk_rows(lp if group.full else lp[group.rows], int(group.value))
        parts.append(top_ids.flatten().to(torch.float64))
        parts.append(values.flatten().to(torch.float64))
    return parts


def _unpack(values: list[float], rows: SamplingRows, drew: bool) -> list[SampledToken]:
    """Split the transferred list back into one :class:`SampledToken` per row."""
    num_rows = rows.num_rows
    ids = [int(v) for v in values[:num_rows]]
    pos = num_rows
    if drew:
        num_drawn = len(rows.generators)
        if any(values[pos:pos + num_drawn]):
            raise RuntimeError(INVALID_PROBS)
        pos += num_drawn
    lp_rows = [row for row, n in enumerate(rows.logprobs) if n is not None]
    logprob: dict[int, float] = dict(zip(lp_rows, values[pos:pos + len(lp_rows)]))
    pos += len(lp_rows)
    top: dict[int, tuple[tuple[int, float], ...]] = {}
    for group in rows.top_logprobs:
        k = int(group.value)
        size = len(group.positions) * k
        top_ids, top_values = values[pos:pos + size], values[pos + size:pos + 2 * size]
        pos += 2 * size
        for j, member in enumerate(group.positions):
            top[lp_rows[member]] = tuple(
                zip(map(int, top_ids[j * k:(j + 1) * k]), top_values[j * k:(j + 1) * k]))
    return [SampledToken(token) if row not in logprob
            else SampledToken(token, logprob[row], top.get(row, ()))
            for row, token in enumerate(ids)]
