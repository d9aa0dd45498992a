"""One step's sampling parameters, gathered once from the sampling rows into tensors.

The batched sampler (:mod:`freetoken.engine.batch_sampler`) reads only this object: which rows
are greedy and which draw, each drawing row's temperature, top-k, top-p and generator, and which
rows want logprobs (and how many alternatives). Rows sharing a top-k or a top-logprobs count are
grouped, so each distinct count costs one ``torch.topk`` over its rows.

Shapes: R = sampling rows of the step, S = drawing (non-greedy) rows, P = drawing rows with a
top-p below 1, L = rows that asked for logprobs, V = sampleable vocabulary size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from freetoken.core import SamplingParams
from freetoken.engine.sampler import GREEDY_TEMPERATURE


@dataclass(frozen=True)
class RowGroup:
    """Rows that share one integer parameter (a top-k, or a top-logprobs count).

    Attributes:
        value: the shared parameter.
        positions: the rows' positions in the tensor the group indexes, ascending.
        rows: ``[n]`` long, ``positions`` on the logits' device.
        full: True when ``positions`` is every row of that tensor (no gather needed).
    """

    value: int
    positions: tuple[int, ...]
    rows: torch.Tensor
    full: bool


@dataclass(frozen=True)
class SamplingRows:
    """Per-row parameters of one step's sampling rows.

    Attributes:
        num_rows: R.
        greedy: ``[G]`` long, rows picked by argmax (temperature below
            :data:`~freetoken.engine.sampler.GREEDY_TEMPERATURE`).
        drawn: ``[S]`` long, rows drawn from their own generator.
        generators: the S drawing rows' generators, in ``drawn`` order.
        temperatures: ``[S, 1]`` float32, each drawing row's temperature.
        inverse_temperatures: ``[S, 1]`` float32, ``1 / temperatures`` rounded once to float32
            on the CPU: CUDA divides a tensor by a Python scalar as a multiplication by this
            reciprocal, and the batched path must round as the per-row one does.
        top_k: groups over the drawing rows (positions in ``drawn``) with ``0 < k < V``.
        top_p_rows: ``[P]`` long, positions in ``drawn`` of the rows with ``top_p < 1``.
        top_p: ``[P, 1]`` float32, those rows' nucleus mass.
        logprob_rows: ``[L]`` long, rows that asked for logprobs.
        top_logprobs: groups over the logprob rows (positions in ``logprob_rows``) by
            ``n = min(logprobs, V) > 0``.
        logprobs: per row, the number of alternatives asked for (None: no logprobs).
    """

    num_rows: int
    greedy: torch.Tensor
    drawn: torch.Tensor
    generators: tuple[torch.Generator, ...]
    temperatures: torch.Tensor
    inverse_temperatures: torch.Tensor
    top_k: tuple[RowGroup, ...]
    top_p_rows: torch.Tensor
    top_p: torch.Tensor
    logprob_rows: torch.Tensor
    top_logprobs: tuple[RowGroup, ...]
    logprobs: tuple[int | None, ...]

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
        greedy, drawn, gens, temps, top_p_pos, top_p = [], [], [], [], [], []
        by_k: dict[int, list[int]] = {}
        for row, (p, gen) in enumerate(zip(params, generators, strict=True)):
            if p.temperature < GREEDY_TEMPERATURE:
                greedy.append(row)
                continue
            if gen is None:
                raise ValueError("sampling with temperature > 0 needs a torch.Generator")
            if 0 < p.top_k < vocab_size:
                by_k.setdefault(p.top_k, []).append(len(drawn))
            if p.top_p < 1.0:
                top_p_pos.append(len(drawn))
                top_p.append(p.top_p)
            drawn.append(row)
            gens.append(gen)
            temps.append(p.temperature)
        logprob_rows = [row for row, p in enumerate(params) if p.logprobs is not None]
        by_n: dict[int, list[int]] = {}
        for pos, row in enumerate(logprob_rows):
            n = min(params[row].logprobs, vocab_size)
            if n > 0:
                by_n.setdefault(n, []).append(pos)
        temperatures = torch.tensor(temps, dtype=torch.float32).reshape(-1, 1)  # [S, 1]
        return cls(
            num_rows=len(params),
            greedy=_longs(greedy, device),
            drawn=_longs(drawn, device),
            generators=tuple(gens),
            temperatures=temperatures.to(device),
            inverse_temperatures=(1.0 / temperatures).to(device),
            top_k=_groups(by_k, len(drawn), device),
            top_p_rows=_longs(top_p_pos, device),
            top_p=torch.tensor(top_p, dtype=torch.float32, device=device).reshape(-1, 1),
            logprob_rows=_longs(logprob_rows, device),
            top_logprobs=_groups(by_n, len(logprob_rows), device),
            logprobs=tuple(p.logprobs for p in params),
        )


def _longs(values: list[int], device: torch.device | str) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)


def _groups(by_value: dict[int, list[int]], total: int,
            device: torch.device | str) -> tuple[RowGroup, ...]:
    return tuple(RowGroup(value, tuple(rows), _longs(rows, device), len(rows) == total)
                 for value, rows in by_value.items())
