"""Descriptive statistics: mean, median and spread of a sequence of numbers."""

from __future__ import annotations

from typing import Iterable


def _numbers(values: Iterable[float]) -> list[float]:
    """The values as a list; raises ValueError when there are none."""
    items = list(values)
    if not items:
        raise ValueError("statistics of an empty sequence are undefined")
    return items


def mean(values: Iterable[float]) -> float:
    """The arithmetic mean of ``values``."""
    items = _numbers(values)
    return sum(items) / len(items)


def median(values: Iterable[float]) -> float:
    """The middle value of ``values`` once sorted."""
    items = sorted(_numbers(values))
    middle = len(items) // 2
    return items[middle]


def spread(values: Iterable[float]) -> float:
    """The largest value minus the smallest."""
    items = _numbers(values)
    return max(items) - min(items)
