"""tally: small descriptive statistics over sequences of numbers."""

from tally.stats import mean, median, spread

__all__ = ["mean", "median", "spread"]
