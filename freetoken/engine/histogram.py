"""Fixed-bucket histograms for ``/metrics``, rendered in the Prometheus text format 0.0.4
without a client library.

:class:`Histogram` is written by the engine thread and snapshotted by the HTTP thread; a small
lock keeps a snapshot's buckets, sum and count from one instant (a scrape never sees a bucket
counted without its sum, so the ``+Inf`` bucket always equals ``_count``).
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left
from dataclasses import dataclass


def _text(value: float) -> str:
    """A float in shortest round-trip form, infinities as ``+Inf`` / ``-Inf``."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


@dataclass(frozen=True)
class HistogramSnapshot:
    """Observations of one histogram at one instant.

    Attributes:
        bounds: the buckets' upper bounds (inclusive, strictly increasing, finite), in the
            histogram's unit.
        counts: observations per bucket, not cumulative: ``counts[i]`` for
            ``bounds[i-1] < v <= bounds[i]``, and one extra last entry for ``v > bounds[-1]``.
        sum: sum of all observed values, in the histogram's unit.
    """

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float = 0.0

    @classmethod
    def empty(cls, bounds: tuple[float, ...]) -> HistogramSnapshot:
        """No observations yet."""
        return cls(bounds, (0,) * (len(bounds) + 1))

    @property
    def count(self) -> int:
        """Number of observations."""
        return sum(self.counts)

    def cumulative(self) -> tuple[int, ...]:
        """Observations ``<= bounds[i]`` for each bound, then the total (the ``+Inf`` bucket)."""
        out, running = [], 0
        for n in self.counts:
            running += n
            out.append(running)
        return tuple(out)

    def render(self, name: str, help_text: str) -> list[str]:
        """The family's lines: ``# HELP``, ``# TYPE name histogram``, one cumulative
        ``name_bucket{le="..."}`` per bound and ``le="+Inf"``, then ``name_sum`` and
        ``name_count``."""
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        for bound, n in zip((*self.bounds, math.inf), self.cumulative()):
            lines.append(f'{name}_bucket{{le="{_text(bound)}"}} {n}')
        return [*lines, f"{name}_sum {_text(self.sum)}", f"{name}_count {self.count}"]


class Histogram:
    """Counts observations into fixed buckets (Prometheus ``le`` semantics: a value equal to a
    bound falls into that bound's bucket).

    Args:
        bounds: the buckets' upper bounds in the histogram's unit, strictly increasing and
            finite (the ``+Inf`` bucket is implicit).

    Raises:
        ValueError: empty, unsorted, repeated or non-finite bounds.
    """

    def __init__(self, bounds: tuple[float, ...]) -> None:
        if not bounds or not all(math.isfinite(b) for b in bounds):
            raise ValueError(f"histogram bounds must be finite and non-empty, got {bounds}")
        if any(a >= b for a, b in zip(bounds, bounds[1:])):
            raise ValueError(f"histogram bounds must be strictly increasing, got {bounds}")
        self.bounds = tuple(float(b) for b in bounds)
        self._counts = [0] * (len(bounds) + 1)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        """Count one observation of ``value`` (in the histogram's unit).

        Raises:
            ValueError: ``value`` is NaN.
        """
        if math.isnan(value):
            raise ValueError("cannot observe NaN")
        index = bisect_left(self.bounds, value)
        with self._lock:
            self._counts[index] += 1
            self._sum += value

    def snapshot(self) -> HistogramSnapshot:
        """The observations so far (safe from any thread)."""
        with self._lock:
            return HistogramSnapshot(self.bounds, tuple(self._counts), self._sum)

    def render(self, name: str, help_text: str) -> list[str]:
        """The exposition lines of the observations so far (:meth:`HistogramSnapshot.render`)."""
        return self.snapshot().render(name, help_text)
