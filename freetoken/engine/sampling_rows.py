"""One step's sampling parameters, gathered once from the sampling rows into tensors.

The batched sampler (:mod:`freetoken.engine.batch_sampler`) reads only this object: which rows
are greedy and which draw, each drawing row's temperature, top-k, top-p and generator, and which
rows want logprobs (and how many alternatives). Rows sharing a parameter value are grouped
(:class:`RowGroup`), so each distinct temperature, top-k, top-p or alternatives count costs one
operation over its rows, and row-index tensors exist only where a gather needs them.

Shapes: R = sampling rows of the step, G = greedy rows, S = drawing (non-greedy) rows, L = rows
that asked for logprobs, V = sampleable vocabulary size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from freetoken.core import SamplingParams
from freetoken.engine.sampler import GREEDY_TEMPERATURE


@dataclass(frozen=True)
class RowGroup:
    """Rows that share one parameter value (a temperature, top-k, top-p or logprobs count).

    Each group is applied with the value as a Python scalar: that is the reference's own
    operation (``logits / temperature``, ``mass >= top_p``), so it rounds as the reference does
    on every device (CUDA, for one, divides by a Python scalar as a multiplication by its
    float32 reciprocal, which a per-row divisor tensor would not reproduce). Requests in a batch
    share few distinct values, so there are few groups.

    Attributes:
        value: the shared parameter.
        positions: the rows' positions in the tensor the group indexes, ascending.
        rows: ``[n]`` long, ``positions`` on the logits' device; None when ``full``.
        full: True when ``positions`` is every row of that tensor (no gather needed).
    """

    value: float
    positions: tuple[int, ...]
    rows: torch.Tensor | None
    full: bool


@dataclass(frozen=True)
class SamplingRows:
    """Per-row parameters of one step's sampling rows.

    Attributes:
        num_rows: R.
        num_greedy: G, rows picked by argmax (temperature below
            :data:`~freetoken.engine.sampler.GREEDY_TEMPERATURE`).
        greedy: ``[G]`` long, the greedy rows; None unless some rows draw.
        drawn: ``[S]`` long, the rows drawn from their own generator; None unless some rows
            are greedy.
        generators: the S drawing rows' generators, in row order.
        temperature: groups over the drawing rows (positions among them) by temperature,
            1.0 left out (dividing by 1 changes nothing).
        top_k: groups over the drawing rows by ``k``, only ``0 < k < V``.
        top_p: groups over the drawing rows by ``p``, only ``p < 1``.
        logprob_rows: ``[L]`` long, the rows that asked for logprobs; None when all or none
            did.
        top_logprobs: groups over the logprob rows (positions among them) by
            ``n = min(logprobs, V) > 0``.
        logprobs: per row, the number of alternatives asked for (None: no logprobs).
    """

    num_rows: int
    num_greedy: int
    greedy: torch.Tensor | None
    drawn: torch.Tensor | None
    generators: tuple[torch.Generator, ...]
    temperature: tuple[RowGroup, ...]
    top_k: tuple[RowGroup, ...]
    top_p: tuple[RowGroup, ...]
    logprob_rows: torch.Tensor | None
    top_logprobs: tuple[RowGroup, ...]
    logprobs: tuple[int | None, ...]

    @property
    def num_logprob_rows(self) -> int:
        """L, the rows that asked for logprobs."""
        return sum(n is not None for n in self.logprobs)

    @property
    def writes_rows(self) -> bool:
        """Whether a filter changes some drawing rows but not all (it then writes into the
        drawing rows' logits, which must be a copy)."""
        return any(not g.full for g in (*self.temperature, *self.top_k, *self.top_p))

    @classmethod
    def build(cls, params: Sequence[SamplingParams],
              generators: Sequence[torch.Generator | None], vocab_size: int,
              device: torch.device | str) -> SamplingRows:
        """Gather the rows' parameters (one entry of ``params`` per logits row).

        Args:
            params: each row's sampling parameters.
            generators: each row's generator (None allowed for greedy rows).
            vocab_size: V, the columns the sampler sees (top-k and logprob counts clamp to it).
            device: where the logits live.

        Raises:
            ValueError: a drawing row has no generator.
        """
        greedy, drawn, gens = [], [], []
        by_t: dict[float, list[int]] = {}
        by_k: dict[float, list[int]] = {}
        by_p: dict[float, list[int]] = {}
        for row, (p, gen) in enumerate(zip(params, generators, strict=True)):
            if p.temperature < GREEDY_TEMPERATURE:
                greedy.append(row)
                continue
            if gen is None:
                raise ValueError("sampling with temperature > 0 needs a torch.Generator")
            pos = len(drawn)
            if p.temperature != 1.0:
                by_t.setdefault(p.temperature, []).append(pos)
            if 0 < p.top_k < vocab_size:
                by_k.setdefault(p.top_k, []).append(pos)
            if p.top_p < 1.0:
                by_p.setdefault(p.top_p, []).append(pos)
            drawn.append(row)
            gens.append(gen)
        mixed = bool(greedy) and bool(drawn)
        logprob_rows = [row for row, p in enumerate(params) if p.logprobs is not None]
        by_n: dict[float, list[int]] = {}
        for pos, row in enumerate(logprob_rows):
            n = min(params[row].logprobs, vocab_size)
            if n > 0:
                by_n.setdefault(n, []).append(pos)
        return cls(
            num_rows=len(params),
            num_greedy=len(greedy),
            greedy=_longs(greedy, device) if mixed else None,
            drawn=_longs(drawn, device) if mixed else None,
            generators=tuple(gens),
            temperature=_groups(by_t, len(drawn), device),
            top_k=_groups(by_k, len(drawn), device),
            top_p=_groups(by_p, len(drawn), device),
            logprob_rows=(_longs(logprob_rows, device)
                          if 0 < len(logprob_rows) < len(params) else None),
            top_logprobs=_groups(by_n, len(logprob_rows), device),
            logprobs=tuple(p.logprobs for p in params),
        )


def _longs(values: list[int], device: torch.device | str) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)


def _groups(by_value: dict[float, list[int]], total: int,
            device: torch.device | str) -> tuple[RowGroup, ...]:
    return tuple(RowGroup(value, tuple(rows),
                          None if len(rows) == total else _longs(rows, device), len(rows) == total)
                 for value, rows in by_value.items())
