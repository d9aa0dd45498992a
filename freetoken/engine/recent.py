"""A bounded record of the engine's most recently finished requests (TTFT, decode speed) for
the status page (``GET /v1/freetoken/status``, ``/ui``).

The engine thread appends; any thread reads a copy (a lock guards the ring, appends are O(1)).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

from freetoken.engine.request import EngineRequest

RECENT_REQUESTS = 128
"""Finished requests kept (the oldest is dropped beyond it)."""


@dataclass(frozen=True)
class RequestTiming:
    """One finished request.

    Attributes:
        seq: 1 for the first request the engine finished, counting up (never reused).
        request_id: the API's request id (``chatcmpl-…``, ``msg_…``).
        finish_reason: ``stop``, ``length``, ``abort`` or ``error``.
        finished_at: unix time (s) it finished.
        prompt_tokens: prompt length (tokens).
        cached_tokens: prompt tokens reused from the prefix cache.
        output_tokens: tokens generated.
        ttft_s: seconds from arrival at the engine to the first sampled token; None without one.
        decode_tok_s: tokens per second after the first one, ``(output_tokens - 1) /
            (finish - first token)``; None with fewer than two tokens.
    """

    seq: int
    request_id: str
    finish_reason: str
    finished_at: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    ttft_s: float | None
    decode_tok_s: float | None


def timing_of(req: EngineRequest, reason: str, seq: int) -> RequestTiming:
    """The :class:`RequestTiming` of a request that finished now (``finish_time`` set, or now)."""
    end = req.finish_time if req.finish_time is not None else time.perf_counter()
    first = req.first_token_time
    n_out = len(req.output_ids)
    ttft = None if first is None else first - req.arrival_time
    speed = None
    if first is not None and n_out > 1 and end > first:
        speed = (n_out - 1) / (end - first)
    return RequestTiming(seq, req.request.request_id, reason, time.time(), req.num_prompt_tokens,
                         req.num_cached_tokens, n_out, ttft, speed)


class RecentRequests:
    """The last ``maxlen`` finished requests, oldest first."""

    def __init__(self, maxlen: int = RECENT_REQUESTS) -> None:
        self._lock = threading.Lock()
        self._ring: deque[RequestTiming] = deque(maxlen=maxlen)
        self._count = 0

    def add(self, req: EngineRequest, reason: str) -> None:
        """Record ``req``, which finished with ``reason`` (engine thread)."""
        with self._lock:
            self._count += 1
            self._ring.append(timing_of(req, reason, self._count))

    def snapshot(self) -> tuple[RequestTiming, ...]:
        """The kept requests, oldest first (any thread)."""
        with self._lock:
            return tuple(self._ring)
