"""One draw per row from each row's own generator, as ``torch.multinomial(probs, 1)`` draws it.

``torch.multinomial`` with one sample is an exponential race (the Gumbel-max trick in another
form): it fills a tensor like ``probs`` with ``Exponential(1)`` values ``q`` from the generator and
returns ``argmax(probs / q)``. Drawing ``q`` row by row from each row's generator consumes every
generator exactly as the per-row call does, and the division and argmax then run once over all
rows, so each row picks the token the per-row ``torch.multinomial`` would have picked for the
same seed and state. That equivalence is an implementation detail of torch, so it is checked
once per device against ``torch.multinomial`` itself; where it does not hold, each row calls
``torch.multinomial`` (same tokens, one call per row). On the CPU the rows' exponential values
are drawn on several threads (:func:`fill_exponential`).

Shapes: S = drawing rows, V = vocabulary size.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

PARALLEL_DRAW_MIN_VOCAB = 4096
"""Narrowest CPU row whose draw is handed to another thread: a row takes about 25 ns per
column, and at two rows of 4096 columns the hand-off already costs about what it saves
(measured on 2 cores: 8 rows of 8218 columns 1.6 -> 0.9 ms; of 151,936 columns 28 -> 14 ms
alone, about 20 ms right after a multi-threaded torch op, whose OpenMP threads keep spinning
for a while and share the cores)."""

_MATCHES: dict[str, bool] = {}  # device -> the race reproduces torch.multinomial there
_POOL: ThreadPoolExecutor | None = None  # draw threads, started on the first parallel draw


def draw_rows(probs: torch.Tensor, generators: Sequence[torch.Generator]) -> torch.Tensor:
    """One token per row of ``probs``, row ``i`` drawn with ``generators[i]``.

    Args:
        probs: ``[S, V]`` float32 probabilities (softmax output), contiguous.
        generators: S generators on ``probs.device``; each advances as one
            ``torch.multinomial(probs[i], 1, generator=generators[i])`` would advance it.

    Returns:
        ``[S]`` long token ids. A row whose probabilities are NaN (the softmax of an invalid row
        is NaN throughout) yields an id where ``probs`` is NaN, which :func:`invalid_rows`
        reports; ``torch.multinomial`` would raise for it.
    """
    if not race_matches_multinomial(probs.device):
        return torch.cat([torch.multinomial(p, 1, generator=g) for p, g in zip(probs, generators)])
    q = torch.empty_like(probs)  # [S, V]
    fill_exponential(q, generators)
    return torch.argmax(probs / q, dim=-1)


def fill_exponential(q: torch.Tensor, generators: Sequence[torch.Generator]) -> None:
    """Fill row ``i`` of ``q`` with ``Exponential(1)`` values from ``generators[i]``.

    A CPU row's values come from one generator one after another (torch does not split that
    work over its threads), and a row of a large vocabulary takes milliseconds, so rows are
    spread over up to ``torch.get_num_threads()`` threads: each generator is still used by one
    thread, for one row, so every row gets the values it would get alone.

    Args:
        q: ``[S, V]`` float32, written in place.
        generators: S generators on ``q.device``.
    """
    workers = min(torch.get_num_threads(), len(generators))
    if q.device.type != "cpu" or workers < 2 or q.shape[-1] < PARALLEL_DRAW_MIN_VOCAB:
        for row, gen in zip(q, generators):
            row.exponential_(1, generator=gen)
        return
    inference = torch.is_inference_mode_enabled()  # thread-local: the workers must match

    def fill(first: int) -> None:
        with torch.inference_mode(inference):
            for i in range(first, len(generators), workers):
                q[i].exponential_(1, generator=generators[i])

    futures = [_pool().submit(fill, first) for first in range(1, workers)]
    try:
        fill(0)
    finally:
        for future in futures:
            future.result()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=max(1, (os.cpu_count() or 2) - 1),
                                   thread_name_prefix="freetoken-draw")
    return _POOL


def invalid_rows(probs: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``[S]`` bool, True where the drawn row's probabilities were not a distribution.

    A softmax row holds a NaN only when all of it is NaN (a NaN or ``+inf`` logit, or no finite
    one), and argmax prefers NaN, so reading the picked entry is enough: no pass over ``V``.

    Args:
        probs: ``[S, V]`` float32 probabilities the ids were drawn from.
        ids: ``[S]`` long, :func:`draw_rows`' result.
    """
    return probs.gather(-1, ids.unsqueeze(-1)).squeeze(-1).isnan()


def race_matches_multinomial(device: torch.device) -> bool:
    """Whether the exponential race reproduces ``torch.multinomial`` on ``device`` (checked on
    the first call for each device: a few seeds over odd-sized random distributions)."""
    key = str(device)
    if key not in _MATCHES:
        _MATCHES[key] = _probe(torch.device(device))
    return _MATCHES[key]


def _probe(device: torch.device) -> bool:
    logits = torch.randn(3, 4099, generator=torch.Generator().manual_seed(0)) * 3
    probs = torch.softmax(logits, dim=-1).to(device)  # [3, 4099]
    for seed in range(3):
        ref = [torch.multinomial(p, 1, generator=_seeded(seed + i, device))
               for i, p in enumerate(probs)]
        q = torch.empty_like(probs)
        for i, row in enumerate(q):
            row.exponential_(1, generator=_seeded(seed + i, device))
        if not torch.equal(torch.cat(ref), torch.argmax(probs / q, dim=-1)):
            return False
    return True


def _seeded(seed: int, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)
