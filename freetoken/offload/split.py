"""The miss split: how many of a layer's m cache misses are filled (paper §3.3).

``q* = round(m * B_P / B_H)``, clamped to ``[1, m]`` when ``m > 0``: q misses are copied into the
device cache and run there, the other ``m - q`` run on the CPU from the host banks, both branches
at once. B_P (pinned host->device bandwidth) and B_H (CPU expert-kernel bandwidth) come from the
measured profile (``freetoken profile``).

A ratio measured in isolation need not hold while serving (the public release's own issue shows
a calibration choosing a split 8.3x slower than all-fill), so ``split`` mode corrects it online
from the measured durations of both branches, every layer:

* per-expert costs are learned as moving averages: ``c_hit`` (device seconds per cached expert),
  ``c_fill`` (device seconds per filled expert: copy + compute), ``c_cpu`` (CPU-branch seconds
  per expert), separately for decode (1 token) and prefill;
* the overlap of the two branches is learned from the layer's wall time ``w``:
  ``sigma = (w - max(t_dev, t_cpu)) / min(t_dev, t_cpu)`` is 0 when they truly run in parallel
  (a GPU and the host) and 1 when they share the same cores (the "device" is the CPU);
* q minimises the predicted layer time ``max(D, C) + sigma * min(D, C)`` with
  ``D = c_hit * h + c_fill * q`` and ``C = c_cpu * (m - q)``. With parallel branches this is the
  balance point, so the branch that finished last gets less work next time; with shared cores it
  moves work to the branch that is cheaper per expert. The ``q >= 1`` floor belongs to the static
  q* only: the online split may stop filling (q = 0), and it re-measures a branch it has not used
  for :data:`PROBE_EVERY` layers by giving it one expert.

Until both branches have been measured, ``split`` uses the static q*. Fixed strategies for
comparison: ``all-fill`` (q = m), ``all-cpu`` (q = 0) and ``static`` (q*, never corrected).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MODES = ("split", "static", "all-fill", "all-cpu")
EMA = 0.2  # weight of a new measurement in the moving averages
PROBE_EVERY = 32  # layers without fills (or without CPU work) before one probe


@dataclass
class BranchCosts:
    """Learned costs of one regime (decode or prefill), seconds per expert.

    Attributes:
        c_hit, c_fill, c_cpu: moving averages, None until first measured.
        sigma: measured serialisation of the two branches in ``[0, 1]``.
        since_fill, since_cpu: layers since the last fill / the last CPU expert.
    """

    c_hit: float | None = None
    c_fill: float | None = None
    c_cpu: float | None = None
    sigma: float = 0.0
    since_fill: int = 0
    since_cpu: int = 0

    def predict(self, q: int, m: int, h: int) -> float:
        """Predicted layer seconds with q fills of m misses and h hits."""
        d = (self.c_hit or 0.0) * h + self.c_fill * q
        c = self.c_cpu * (m - q)
        return max(d, c) + self.sigma * min(d, c)


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - EMA) * old + EMA * new


class MissSplit:
    """Chooses q per layer and step, and learns from the branch durations.

    Args:
        mode: ``split`` (online), ``static`` (q* only), ``all-fill``, ``all-cpu``.
        ratio: ``B_P / B_H`` of the profile, for the static q*.
        eta: 0 turns the online correction off (``split`` then behaves as ``static``).

    Attributes:
        ratio: the static multiplier r of ``q* = round(m * r)``.
        fill_fraction: moving average of q / m actually chosen (reported as the split ratio).

    Raises:
        ValueError: unknown mode, non-positive ratio or negative eta.
    """

    def __init__(self, mode: str = "split", ratio: float = 0.5, eta: float = 0.3) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown miss split {mode!r}; choose one of {', '.join(MODES)}")
        if not ratio > 0 or not math.isfinite(ratio):
            raise ValueError(f"split ratio B_P/B_H must be a positive number, got {ratio}")
        if eta < 0:
            raise ValueError(f"eta must be >= 0, got {eta}")
        self.mode = mode
        self.ratio = float(ratio)
        self.eta = float(eta)
        self.fill_fraction = {"all-fill": 1.0, "all-cpu": 0.0}.get(mode, min(1.0, self.ratio))
        self.costs = {"decode": BranchCosts(), "prefill": BranchCosts()}

    @property
    def online(self) -> bool:
        """True when q comes from the learned costs."""
        return self.mode == "split" and self.eta > 0

    def static_q(self, misses: int) -> int:
        """``clamp(round(m * B_P / B_H), 1, m)`` (0 for m = 0)."""
        return 0 if misses <= 0 else min(misses, max(1, round(misses * self.ratio)))

    def choose(self, misses: int, free_slots: int, hits: int = 0, tokens: int = 1) -> int:
        """q for ``misses`` = m misses when ``free_slots`` slots can take fills.

        Args:
            misses, free_slots: m and the unpinned slots.
            hits: h, cached experts of the layer (device work that does not depend on q).
            tokens: T of the step (1 = decode).

        Returns:
            ``0 <= q <= min(m, free_slots)``.
        """
        if misses <= 0 or free_slots <= 0 or self.mode == "all-cpu":
            return 0
        cap = min(misses, free_slots)
        if self.mode == "all-fill":
            return cap
        costs = self.costs["decode" if tokens == 1 else "prefill"]
        if not self.online or costs.c_fill is None or costs.c_cpu is None:
            return min(cap, self.static_q(misses))
        q = self._best_q(costs, misses, hits, cap)
        if q == 0 and costs.since_fill >= PROBE_EVERY:
            q = 1  # re-measure the fill branch
        elif q == misses and misses > 1 and costs.since_cpu >= PROBE_EVERY:
            q = misses - 1  # re-measure the CPU branch
        return q

    @staticmethod
    def _best_q(costs: BranchCosts, m: int, h: int, cap: int) -> int:
        denom = costs.c_fill + costs.c_cpu
        balance = (costs.c_cpu * m - (costs.c_hit or 0.0) * h) / denom if denom > 0 else 0.0
        candidates = {0, cap, min(cap, max(0, math.floor(balance))),
                      min(cap, max(0, math.ceil(balance)))}
        # ties go to more fills: a filled expert may hit again later
        return min(candidates, key=lambda q: (costs.predict(q, m, h), -q))

    def observe(self, q: int, misses: int, device_s: float, cpu_s: float, *, hits: int = 0,
                tokens: int = 1, wall_s: float | None = None) -> None:
        """Learn from one layer: q of m misses filled, h hits, branch and wall seconds."""
        if misses > 0 and self.mode in ("split", "static"):
            self.fill_fraction = _ema(self.fill_fraction, q / misses)
        if not self.online or misses <= 0:
            return
        costs = self.costs["decode" if tokens == 1 else "prefill"]
        costs.since_fill = 0 if q > 0 else costs.since_fill + 1
        costs.since_cpu = 0 if q < misses else costs.since_cpu + 1
        if q == 0 and hits > 0:
            costs.c_hit = _ema(costs.c_hit, device_s / hits)
        if q > 0:
            fill = max(0.0, device_s - (costs.c_hit or 0.0) * hits) / q
            costs.c_fill = _ema(costs.c_fill, fill)
        if q < misses:
            costs.c_cpu = _ema(costs.c_cpu, cpu_s / (misses - q))
        short, long = sorted((device_s, cpu_s))
        if wall_s is not None and short > 0:
            costs.sigma = _ema(costs.sigma, min(1.0, max(0.0, (wall_s - long) / short)))
