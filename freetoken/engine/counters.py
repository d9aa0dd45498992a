"""Cumulative engine counters for ``/metrics``: requests by finish reason, tokens, queue sizes.

:class:`CounterBook` is updated by the engine thread; :meth:`CounterBook.snapshot` may be read
from any thread (plain int reads under the GIL; the reason dict never changes size), so a
metrics scrape never waits for a step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from freetoken.core import FinishReason

FINISH_REASONS: tuple[FinishReason, ...] = ("stop", "length", "abort", "error")


@dataclass(frozen=True)
class EngineCounters:
    """Snapshot of the engine's counters (all cumulative since start, except the gauges).

    Attributes:
        requests_added: requests accepted by the engine.
        finished: requests finished per finish reason (every key of ``FINISH_REASONS``).
        prompt_tokens: prompt tokens run through the model (prefill chunks).
        generation_tokens: tokens sampled (every output token, stop tokens included).
        running: requests being computed now (gauge).
        waiting: requests queued behind them (gauge).
        cached_tokens: prompt tokens reused from the prefix cache instead of computed.
        prefix: prefix-cache gauges and counters (``PrefixCache.stats()``: KV pages, radix
            tokens and nodes, recurrent-state checkpoints), empty without a prefix cache.
    """

    requests_added: int = 0
    finished: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0))
    prompt_tokens: int = 0
    generation_tokens: int = 0
    running: int = 0
    waiting: int = 0
    cached_tokens: int = 0
    prefix: dict[str, int] = field(default_factory=dict)


class CounterBook:
    """The engine's mutable counters (engine thread writes; any thread snapshots)."""

    def __init__(self) -> None:
        self.requests_added = 0
        self.finished: dict[str, int] = dict.fromkeys(FINISH_REASONS, 0)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.cached_tokens = 0
        self.prefix: dict[str, int] = {}

    def on_added(self) -> None:
        """A request was accepted."""
        self.requests_added += 1

    def on_step(self, start: int, num_tokens: int, num_prompt_tokens: int, sampled: bool) -> None:
        """Account for an executed batch of ``num_tokens`` ids starting at position ``start``:
        the part inside the prompt (``num_prompt_tokens`` ids) counts as prompt tokens, and a
        sampled token as one generated token."""
        self.prompt_tokens += max(0, min(start + num_tokens, num_prompt_tokens) - start)
        self.generation_tokens += int(sampled)

    def on_admitted(self, cached_tokens: int) -> None:
        """A request started with ``cached_tokens`` prompt ids reused from the prefix cache."""
        self.cached_tokens += cached_tokens

    def on_finish(self, reason: str) -> None:
        """A request left the engine with ``reason``."""
        self.finished[reason] = self.finished.get(reason, 0) + 1

    def snapshot(self, running: int, waiting: int) -> EngineCounters:
        """The counters now, with the given queue gauges."""
        return EngineCounters(
            requests_added=self.requests_added,
            finished=dict(self.finished),
            prompt_tokens=self.prompt_tokens,
            generation_tokens=self.generation_tokens,
            running=running,
            waiting=waiting,
            cached_tokens=self.cached_tokens,
            prefix=dict(self.prefix),
        )
