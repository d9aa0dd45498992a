"""The engine's mutable record of one request: token accounting, status and timings."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from freetoken.core import FinishReason, GenerationOutput, GenerationRequest

logger = logging.getLogger("freetoken.engine")

OutputSink = Callable[[GenerationOutput], None]
"""Receives a request's output chunks on the engine thread; must not block."""


class RequestStatus(Enum):
    """Where a request is in its lifecycle."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class EngineRequest:
    """One request inside the engine (owned by the scheduler, read by the engine's update).

    Attributes:
        key: engine-internal unique id.
        request: the immutable request from the API layer.
        sink: where output chunks go.
        output_ids: generated token ids so far.
        num_computed_tokens: ids of ``prompt + output`` already consumed by the model state.
        status: lifecycle state.
        arrival_time: ``time.perf_counter()`` seconds when the engine received the request.
        first_scheduled_time: ``time.perf_counter()`` seconds when its first step started
            (after scheduling, before the model ran), or None while it has not run.
        first_token_time: when the first output token was sampled, or None.
        last_token_time: when the latest output token was sampled, or None.
        inter_token_s: seconds between the two latest sampled tokens, or None before the second.
        finish_time: when it finished, or None.
        num_cached_tokens: prompt ids reused from the prefix cache at first admission (reported
            as ``cached_tokens`` / ``cache_read_input_tokens``).
        num_prefilled_tokens: prompt ids actually run through the model (recomputed), all
            admissions together.
        num_admissions: times the request was admitted (more than once after a preemption).
        needs_state: the runner must build the request's state on its next entry.
        restore: the prefix-cache reuse decision of the latest admission, or None.
    """

    key: int
    request: GenerationRequest
    sink: OutputSink
    output_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    arrival_time: float = field(default_factory=time.perf_counter)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    inter_token_s: float | None = None
    finish_time: float | None = None
    num_cached_tokens: int = 0
    num_prefilled_tokens: int = 0
    num_admissions: int = 0
    needs_state: bool = True
    restore: Any = None

    @property
    def num_prompt_tokens(self) -> int:
        """Number of prompt ids."""
        return len(self.request.prompt_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated ids."""
        return len(self.request.prompt_ids) + len(self.output_ids)

    def token_slice(self, start: int, stop: int) -> tuple[int, ...]:
        """The ids ``[start, stop)`` of ``prompt + output`` without building the whole list."""
        prompt = self.request.prompt_ids
        n = len(prompt)
        if stop <= n:
            return prompt[start:stop]
        head = prompt[start:] if start < n else ()
        return head + tuple(self.output_ids[max(start - n, 0) : stop - n])

    def append_token(self, token_id: int) -> None:
        """Record a sampled token and its time (the first one's, or the gap since the
        previous one)."""
        now = time.perf_counter()
        if self.first_token_time is None:
            self.first_token_time = now
        else:
            self.inter_token_s = now - self.last_token_time
        self.last_token_time = now
        self.output_ids.append(token_id)

    def log_finish(self, reason: FinishReason) -> None:
        """Write the per-request summary line: prompt, reused, recomputed and generated tokens,
        TTFT (s) and decode speed (tok/s)."""
        end = self.finish_time if self.finish_time is not None else time.perf_counter()
        n_out = len(self.output_ids)
        ttft = "n/a" if self.first_token_time is None else f"{self.first_token_time - self.arrival_time:.3f}s"
        decode_s = end - self.first_token_time if self.first_token_time is not None else 0.0
        speed = f"{(n_out - 1) / decode_s:.1f} tok/s" if n_out > 1 and decode_s > 0 else "n/a"
        logger.info(
            "request %s finished (%s): prompt %d tokens (reused %d, recomputed %d), generated %d "
            "tokens, TTFT %s, decode %s",
            self.request.request_id, reason, self.num_prompt_tokens, self.num_cached_tokens,
            self.num_prefilled_tokens, n_out, ttft, speed,
        )
