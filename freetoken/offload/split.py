"""The miss split: how many of a step's m cache misses are filled (paper §3.3).

``q* = round(m * B_P / B_H)``, clamped to ``[1, m]`` when ``m > 0``: q misses are copied into the
device cache and run there, the other ``m - q`` run on the CPU from the host banks, both branches
at once. B_P (pinned host->device bandwidth) and B_H (CPU expert-kernel bandwidth) come from the
measured profile (``freetoken profile``).

A ratio measured in isolation need not hold while serving (the public release's own issue shows
a calibration choosing a split 8.3x slower than all-fill), so the ratio is corrected online:
after each layer the durations of both branches are compared and the branch that finished last
gets less work next time: ``r <- r * exp(eta * (t_cpu - t_dev) / (t_cpu + t_dev))``, kept in
``[R_MIN, 1]``. The ``q >= 1`` floor belongs to the profiled q*: when the device branch still
finishes last with ``r`` at ``R_MIN`` (its cached hits alone outlast the CPU's misses, e.g. where
the device is slower per expert than the CPU kernel), the split drops to ``r = 0`` (no fills)
and comes back to ``R_MIN`` as soon as the CPU branch is the one finishing last. Fixed strategies for comparison: ``all-fill`` (q = m), ``all-cpu`` (q = 0) and
``static`` (the profile's q*, never corrected).
"""

from __future__ import annotations

import math

MODES = ("split", "static", "all-fill", "all-cpu")
R_MIN = 1.0 / 256.0


class MissSplit:
    """Chooses q per layer and step, and learns from the branch durations.

    Args:
        mode: ``split`` (q* with online correction), ``static`` (q* only), ``all-fill``,
            ``all-cpu``.
        ratio: initial ``B_P / B_H`` (clamped to ``[R_MIN, 1]``).
        eta: correction gain per observation (0 disables it).

    Attributes:
        ratio: current multiplier r of ``q = round(m * r)``.

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
        self.ratio = min(1.0, max(R_MIN, float(ratio)))
        self.eta = float(eta)

    def choose(self, misses: int, free_slots: int) -> int:
        """q for ``misses`` = m misses when ``free_slots`` slots can take fills (not pinned).

        Returns:
            ``0 <= q <= min(m, free_slots)``; for the split modes ``clamp(round(m * r), 1, m)``
            before the slot cap (0 when the online correction has turned fills off).
        """
        if misses <= 0 or free_slots <= 0 or self.mode == "all-cpu":
            return 0
        if self.mode == "all-fill":
            return min(misses, free_slots)
        if self.ratio == 0.0:
            return 0
        q = min(misses, max(1, round(misses * self.ratio)))
        return min(q, free_slots)

    def observe(self, q: int, misses: int, device_s: float, cpu_s: float) -> None:
        """Correct the ratio from one layer's branch durations (seconds); ``split`` mode only.

        Nothing is learned when there were no misses or both durations are zero.
        """
        if self.mode != "split" or misses <= 0 or self.eta == 0:
            return
        total = device_s + cpu_s
        if not total > 0:
            return
        step = self.eta * (cpu_s - device_s) / total
        if self.ratio == 0.0:
            self.ratio = R_MIN if step > 0 else 0.0
        elif self.ratio == R_MIN and step < 0:
            self.ratio = 0.0
        else:
            self.ratio = min(1.0, max(R_MIN, self.ratio * math.exp(step)))
