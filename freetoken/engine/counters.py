"""Cumulative engine counters and latency histograms for ``/metrics``: requests by finish reason,
tokens, queue sizes, time to first token, inter-token latency, queue time, prefill speed.

:class:`CounterBook` is updated by the engine thread; :meth:`CounterBook.snapshot` may be read
from any thread (plain int reads under the GIL; the reason dict never changes size; each
histogram snapshots under its own lock), so a metrics scrape never waits for a step.

Every time is a ``time.perf_counter()`` difference in seconds, taken on the engine thread: a
request's arrival (when the engine received it), the start of its first step (after scheduling,
before the model runs) and each sampled token (when the step that sampled it returned).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from freetoken.core import FinishReason
from freetoken.engine.histogram import Histogram, HistogramSnapshot

FINISH_REASONS: tuple[FinishReason, ...] = ("stop", "length", "abort", "error")

TTFT_BUCKETS_S = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 120.0)
"""Upper bounds (seconds) of the time-to-first-token buckets."""
INTER_TOKEN_BUCKETS_S = (0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5,
                         5.0, 10.0)
"""Upper bounds (seconds) of the inter-token latency buckets."""
QUEUE_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                   30.0, 60.0, 120.0)
"""Upper bounds (seconds) of the queue-time buckets."""
PREFILL_BUCKETS_TOK_S = (10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0,
                         25000.0, 50000.0, 100000.0)
"""Upper bounds (tokens per second) of the prefill-throughput buckets."""


@dataclass(frozen=True)
class EngineCounters:
    """Snapshot of the engine's counters (all cumulative since start, except the gauges).

    Attributes:
        requests_added: requests accepted by the engine.
        finished: requests finished per finish reason (every key of ``FINISH_REASONS``).
        prompt_tokens: prompt tokens of the requests that started (counted whole at a request's
            first scheduled step): ``cached_tokens`` plus the tokens still to compute.
        prompt_tokens_recomputed: prompt tokens run through the model (prefill chunks, counted
            as they run; a preempted request's recomputation counts again).
        generation_tokens: tokens sampled (every output token, stop tokens included).
        running: requests being computed now (gauge).
        waiting: requests queued behind them (gauge).
        cached_tokens: prompt tokens reused from the prefix cache instead of computed (at a
            request's first admission).
        prefix: prefix-cache gauges and counters (``PrefixCache.stats()``: KV pages, radix
            tokens and nodes, recurrent-state checkpoints), empty without a prefix cache.
        time_to_first_token: seconds from arrival to the first sampled token, per request.
        inter_token_latency: seconds between consecutive sampled tokens of a request, one per
            token after the first.
        queue_time: seconds from arrival to the start of the request's first scheduled step.
        prefill_throughput: tokens per second of each request's prefill: its recomputed prompt
            tokens over the seconds from its first step's start to its first sampled token.
    """

    requests_added: int = 0
    finished: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0))
    prompt_tokens: int = 0
    prompt_tokens_recomputed: int = 0
    generation_tokens: int = 0
    running: int = 0
    waiting: int = 0
    cached_tokens: int = 0
    prefix: dict[str, int] = field(default_factory=dict)
    time_to_first_token: HistogramSnapshot = HistogramSnapshot.empty(TTFT_BUCKETS_S)
    inter_token_latency: HistogramSnapshot = HistogramSnapshot.empty(INTER_TOKEN_BUCKETS_S)
    queue_time: HistogramSnapshot = HistogramSnapshot.empty(QUEUE_BUCKETS_S)
    prefill_throughput: HistogramSnapshot = HistogramSnapshot.empty(PREFILL_BUCKETS_TOK_S)


class CounterBook:
    """The engine's mutable counters (engine thread writes; any thread snapshots)."""

    def __init__(self) -> None:
        self.requests_added = 0
        self.finished: dict[str, int] = dict.fromkeys(FINISH_REASONS, 0)
        self.prompt_tokens = 0
        self.prompt_tokens_recomputed = 0
        self.generation_tokens = 0
        self.cached_tokens = 0
        self.prefix: dict[str, int] = {}
        self.ttft = Histogram(TTFT_BUCKETS_S)
        self.inter_token = Histogram(INTER_TOKEN_BUCKETS_S)
        self.queue = Histogram(QUEUE_BUCKETS_S)
        self.prefill = Histogram(PREFILL_BUCKETS_TOK_S)

    def on_added(self) -> None:
        """A request was accepted."""
        self.requests_added += 1

    def on_step(self, start: int, num_tokens: int, num_prompt_tokens: int, sampled: bool) -> None:
        """Account for an executed batch of ``num_tokens`` ids starting at position ``start``:
        the part inside the prompt (``num_prompt_tokens`` ids) counts as recomputed prompt
        tokens, and a sampled token as one generated token."""
        self.prompt_tokens_recomputed += max(0, min(start + num_tokens, num_prompt_tokens) - start)
        self.generation_tokens += int(sampled)

    def on_started(self, prompt_tokens: int, cached_tokens: int, queue_s: float) -> None:
        """A request's first step is about to run: ``prompt_tokens`` ids, ``cached_tokens`` of
        them reused from the prefix cache, after ``queue_s`` seconds since arrival."""
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += cached_tokens
        self.queue.observe(queue_s)

    def on_first_token(self, ttft_s: float, prefill_tokens: int, prefill_s: float) -> None:
        """A request sampled its first token ``ttft_s`` seconds after arrival, having run
        ``prefill_tokens`` prompt ids through the model in ``prefill_s`` seconds (skipped from
        the throughput histogram when either is not positive)."""
        self.ttft.observe(ttft_s)
        if prefill_tokens > 0 and prefill_s > 0:
            self.prefill.observe(prefill_tokens / prefill_s)

    def on_next_token(self, gap_s: float) -> None:
        """A request sampled another token ``gap_s`` seconds after its previous one."""
        self.inter_token.observe(gap_s)

    def on_finish(self, reason: str) -> None:
        """A request left the engine with ``reason``."""
        self.finished[reason] = self.finished.get(reason, 0) + 1

    def snapshot(self, running: int, waiting: int) -> EngineCounters:
        """The counters now, with the given queue gauges."""
        return EngineCounters(
            requests_added=self.requests_added,
            finished=dict(self.finished),
            prompt_tokens=self.prompt_tokens,
            prompt_tokens_recomputed=self.prompt_tokens_recomputed,
            generation_tokens=self.generation_tokens,
            running=running,
            waiting=waiting,
            cached_tokens=self.cached_tokens,
            prefix=dict(self.prefix),
            time_to_first_token=self.ttft.snapshot(),
            inter_token_latency=self.inter_token.snapshot(),
            queue_time=self.queue.snapshot(),
            prefill_throughput=self.prefill.snapshot(),
        )
