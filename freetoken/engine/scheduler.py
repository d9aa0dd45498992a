"""First-come-first-served scheduler: a waiting queue, one running request, a token budget.

Pure CPU policy, no torch. Each :meth:`Scheduler.schedule` grants the running request the next
``min(budget, uncomputed)`` of its ``prompt + output`` ids (unified prefill/decode accounting,
vLLM v1 ``Scheduler.schedule``). Long prompts are therefore prefilled in chunks of at most
``max_num_batched_tokens``, so an abort or a newly queued request is looked at within one
chunk's time. Requests run strictly one after another; a request's state never interleaves
with another's.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from freetoken.engine.batch import ScheduledBatch
from freetoken.engine.request import EngineRequest, RequestStatus


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduling limits.

    Attributes:
        max_model_len: most ids (prompt + output) a sequence may hold.
        max_num_batched_tokens: token budget of one step (the prefill chunk size).

    Raises:
        ValueError: a limit is not positive.
    """

    max_model_len: int
    max_num_batched_tokens: int = 2048

    def __post_init__(self) -> None:
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}"
            )


class Scheduler:
    """Owns the waiting queue and the running request; decides what each step computes."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.waiting: deque[EngineRequest] = deque()
        self.running: EngineRequest | None = None

    def add(self, req: EngineRequest) -> None:
        """Queue a request behind the ones already waiting."""
        req.status = RequestStatus.WAITING
        self.waiting.append(req)

    def has_unfinished(self) -> bool:
        """True while any request is waiting or running."""
        return self.running is not None or bool(self.waiting)

    def get(self, key: int) -> EngineRequest | None:
        """The waiting or running request with ``key``, or None."""
        if self.running is not None and self.running.key == key:
            return self.running
        return next((r for r in self.waiting if r.key == key), None)

    def schedule(self) -> ScheduledBatch | None:
        """Grant the next prefill chunk or decode step, promoting a waiting request if idle.

        Returns:
            The step's work, or None when nothing is waiting or running.
        """
        if self.running is None:
            if not self.waiting:
                return None
            self.running = self.waiting.popleft()
            self.running.status = RequestStatus.RUNNING
        req = self.running
        start = req.num_computed_tokens
        stop = min(req.num_tokens, start + self.config.max_num_batched_tokens)
        return ScheduledBatch(
            request_key=req.key,
            token_ids=req.token_slice(start, stop),
            num_computed_tokens=start,
            sample=stop == req.num_tokens,
            sampling=req.request.sampling,
        )

    def update(self, batch: ScheduledBatch, token_id: int | None) -> EngineRequest:
        """Account for an executed batch: its ids are now computed; append the sampled token.

        Raises:
            KeyError: the batch's request is not the running one.
        """
        req = self.running
        if req is None or req.key != batch.request_key:
            raise KeyError(f"request {batch.request_key} is not running")
        req.num_computed_tokens += len(batch.token_ids)
        if token_id is not None:
            req.append_token(token_id)
        return req

    def finish(self, key: int) -> EngineRequest | None:
        """Remove a request wherever it is (finished, aborted or failed).

        Returns:
            The removed request, or None when it was not queued or running.
        """
        req = self.get(key)
        if req is None:
            return None
        if req is self.running:
            self.running = None
        else:
            self.waiting.remove(req)
        req.status = RequestStatus.FINISHED
        return req
