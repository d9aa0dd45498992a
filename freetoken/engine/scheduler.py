"""Continuous-batching scheduler: decode steps of every running request plus chunked prefill.

Pure CPU policy. Each :meth:`Scheduler.schedule` builds one :class:`ScheduledBatch` under a token
budget (``max_num_batched_tokens``), vLLM v1 / SGLang style with unified token accounting:

1. commit steps of requests that just finished (their last sampled token is fed once so the
   generation-end checkpoint and KV exist for the next turn);
2. one decode token for every running request whose prompt is done;
3. the next prefill chunk of running requests still prefilling (FCFS), leaving up to
   ``ADMISSION_RESERVE`` tokens (a quarter of the budget at most) for waiting requests; the anchor positions
   inside a chunk are listed in its ``capture`` so the model snapshots the recurrent state
   exactly there without splitting the chunk;
4. admission of waiting requests while fewer than ``max_running_requests`` run and budget
   remains: the prefix cache matches their ids and allocates their prompt's KV slots (admission
   by memory; a request that does not fit waits).

When a decode step cannot get a KV page, the most recently admitted other request is preempted:
its computed ids stay in the radix tree (with a tail checkpoint) and it re-queues at the front,
so re-admission reuses them. Without a prefix cache (models without paged KV) the same policy
runs with per-request contiguous states.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from freetoken.engine.batch import ForwardOutput, ScheduledBatch, SeqWork
from freetoken.engine.request import EngineRequest, RequestStatus
from freetoken.prefix.kv_pool import OutOfPages
from freetoken.prefix.manager import PrefixCache, StateTensors


ADMISSION_RESERVE = 512
"""Most tokens of a step's budget kept from running prefills while requests wait for admission."""


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduling limits.

    Attributes:
        max_model_len: most ids (prompt + output) a sequence may hold.
        max_num_batched_tokens: token budget of one step (bounds a prefill chunk).
        max_running_requests: requests computed concurrently (``--max-running-requests``).

    Raises:
        ValueError: a limit is not positive.
    """

    max_model_len: int
    max_num_batched_tokens: int = 2048
    max_running_requests: int = 8

    def __post_init__(self) -> None:
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}"
            )
        if self.max_running_requests < 1:
            raise ValueError(
                f"max_running_requests must be >= 1, got {self.max_running_requests}"
            )


class Scheduler:
    """Owns the waiting queue, the running set and the prefix cache's per-request bookkeeping.

    Args:
        config: limits.
        prefix: the prefix cache (paged models), or None.
        state_tensors: ``key -> live recurrent-state tensors`` of the runner (checkpoints).
    """

    def __init__(self, config: SchedulerConfig, prefix: PrefixCache | None = None,
                 state_tensors: StateTensors | None = None) -> None:
        self.config = config
        self.prefix = prefix
        self._state_tensors = state_tensors or (lambda _key: None)
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self.committing: list[EngineRequest] = []
        self._released: list[int] = []
        self._scheduled: set[int] = set()
        self._rejected: list[tuple[EngineRequest, str]] = []

    # ------------------------------------------------------------------ queue
    def add(self, req: EngineRequest) -> None:
        """Queue a request behind the ones already waiting."""
        req.status = RequestStatus.WAITING
        self.waiting.append(req)

    def has_unfinished(self) -> bool:
        """True while any request is waiting, running or committing."""
        return bool(self.running or self.waiting or self.committing)

    def get(self, key: int) -> EngineRequest | None:
        """The waiting or running request with ``key``, or None."""
        for req in self.running:
            if req.key == key:
                return req
        return next((r for r in self.waiting if r.key == key), None)

    def drain_released(self) -> list[int]:
        """Keys whose model-runner state must be dropped now (preempted, committed)."""
        out, self._released = self._released, []
        return out

    def drain_rejected(self) -> list[tuple[EngineRequest, str]]:
        """Requests that can never be admitted (need more KV than the pool holds), with why."""
        out, self._rejected = self._rejected, []
        return out

    # ------------------------------------------------------------------ schedule
    def schedule(self) -> ScheduledBatch | None:
        """Build the next step's batch (see the module docstring).

        Returns:
            The step's work, or None when nothing can run.
        """
        budget = self.config.max_num_batched_tokens
        entries: list[SeqWork] = []
        self._scheduled: set[int] = set()
        for req in list(self.committing):
            work = self._commit_work(req)
            if work is not None:
                entries.append(work)
                budget -= 1
        decoding = [r for r in self.running if r.num_tokens - r.num_computed_tokens == 1]
        prefilling = [r for r in self.running if r.num_tokens - r.num_computed_tokens > 1]
        for req in decoding:
            if budget <= 0:
                break
            if req not in self.running:  # preempted by an earlier entry's page allocation
                continue
            work = self._work(req, 1)
            if work is not None:
                entries.append(work)
                budget -= 1
        # a long prefill leaves room for newcomers, so a short request is not stuck behind it
        can_admit = bool(self.waiting) and len(self.running) < self.config.max_running_requests
        reserve = min(budget // 4, ADMISSION_RESERVE) if can_admit else 0
        for req in prefilling:
            if budget - reserve <= 0:
                break
            if req not in self.running:
                continue
            work = self._work(req, budget - reserve)
            if work is not None:
                entries.append(work)
                budget -= len(work.token_ids)
        while budget > 0 and self.waiting and len(self.running) < self.config.max_running_requests:
            req = self.waiting[0]
            admitted = self._admit(req)
            if admitted is None:
                continue  # rejected for good
            if not admitted:
                break
            work = self._work(req, budget)
            if work is not None:
                entries.append(work)
                budget -= len(work.token_ids)
        return ScheduledBatch(tuple(entries)) if entries else None

    def _admit(self, req: EngineRequest) -> bool | None:
        """True: admitted; False: no memory now (wait); None: can never fit (rejected)."""
        ids = req.token_slice(0, req.num_tokens)
        prefix = self.prefix
        if prefix is not None:
            if not prefix.can_hold(req.num_tokens + 1):
                self.waiting.popleft()
                req.status = RequestStatus.FINISHED
                self._rejected.append((req, (
                    f"the request needs {req.num_tokens + 1} tokens of KV cache but the pool holds "
                    f"{prefix.pool.num_slots}; raise --kv-cache-bytes or shorten the prompt")))
                return None
            try:
                reuse = prefix.admit(req.key, ids, req.num_prompt_tokens,
                                     req.request.anchors)
            except OutOfPages:
                return False
            req.num_computed_tokens = reuse.length
            req.restore = reuse
            if req.num_admissions == 0:
                req.num_cached_tokens = reuse.length
        else:
            req.num_computed_tokens = 0
        req.num_admissions += 1
        req.needs_state = True
        self.waiting.popleft()
        req.status = RequestStatus.RUNNING
        self.running.append(req)
        return True

    def _work(self, req: EngineRequest, budget: int) -> SeqWork | None:
        start = req.num_computed_tokens
        stop = min(req.num_tokens, start + budget)
        prefix = self.prefix
        slots: tuple[int, ...] = ()
        capture: tuple[int, ...] = ()
        if prefix is not None:
            slots = self._slots(req, start, stop)
            if slots is None:
                return None
            capture = prefix.boundaries_in(req.key, start, stop)
        work = SeqWork(
            request_key=req.key,
            token_ids=req.token_slice(start, stop),
            num_computed_tokens=start,
            sample=stop == req.num_tokens,
            sampling=req.request.sampling,
            new_state=req.needs_state,
            prefix_slots=req.restore.slots if (req.needs_state and req.restore) else (),
            restore_checkpoint=req.restore.checkpoint if (req.needs_state and req.restore) else None,
            slots=slots,
            capture=capture,
            decode=start >= req.num_prompt_tokens,
        )
        req.needs_state = False
        self._scheduled.add(req.key)
        return work

    def _slots(self, req: EngineRequest, start: int, stop: int) -> tuple[int, ...] | None:
        """KV slots for ``[start, stop)``; preempts younger requests when the pool is full."""
        while True:
            try:
                return self.prefix.slots(req.key, start, stop)
            except OutOfPages:
                victim = next((r for r in reversed(self.running)
                               if r is not req and r.key not in self._scheduled), None)
                if victim is None:
                    self._preempt(req)
                    return None
                self._preempt(victim)

    def _preempt(self, req: EngineRequest) -> None:
        self.running.remove(req)
        self.prefix.release(req.key, req.token_slice(0, req.num_tokens), req.num_computed_tokens,
                            self._state_tensors(req.key))
        self._released.append(req.key)
        req.status = RequestStatus.WAITING
        req.restore = None
        self.waiting.appendleft(req)

    def _commit_work(self, req: EngineRequest) -> SeqWork | None:
        start = req.num_computed_tokens
        try:
            slots = self.prefix.slots(req.key, start, start + 1)
        except OutOfPages:
            self._end_commit(req, with_state=False)
            return None
        self._scheduled.add(req.key)
        return SeqWork(req.key, req.token_slice(start, start + 1), start, False,
                       req.request.sampling, slots=slots,
                       capture=(start + 1,) if self.prefix.hybrid else (), decode=True)

    # ------------------------------------------------------------------ update
    def update(self, work: SeqWork, output: ForwardOutput) -> EngineRequest | None:
        """Account for an executed entry: its ids are now computed; append the sampled token;
        save the checkpoints of the states it captured.

        Returns:
            The running request, or None for a commit step (the request had already finished;
            it is released now).

        Raises:
            KeyError: the entry's request is neither running nor committing.
        """
        req = next((r for r in self.running if r.key == work.request_key), None)
        committing = req is None
        if committing:
            req = next((r for r in self.committing if r.key == work.request_key), None)
        if req is None:
            raise KeyError(f"request {work.request_key} is not running")
        req.num_computed_tokens += len(work.token_ids)
        if work.num_computed_tokens < req.num_prompt_tokens:
            req.num_prefilled_tokens += min(req.num_computed_tokens, req.num_prompt_tokens) - \
                work.num_computed_tokens
        if output.snapshots:
            ids = req.token_slice(0, req.num_computed_tokens)
            for position, tensors in output.snapshots:
                self.prefix.checkpoint(req.key, ids, position, tensors)
        if committing:
            self._end_commit(req, with_state=False)
            return None
        if output.token_id is not None:
            req.append_token(output.token_id)
        return req

    def abandon_commit(self, key: int) -> None:
        """A commit step failed: release the request without its generation-end checkpoint."""
        req = next((r for r in self.committing if r.key == key), None)
        if req is not None:
            self._end_commit(req, with_state=False)

    def _end_commit(self, req: EngineRequest, with_state: bool) -> None:
        self.committing.remove(req)
        tensors = self._state_tensors(req.key) if with_state else None
        self.prefix.release(req.key, req.token_slice(0, req.num_computed_tokens),
                            req.num_computed_tokens, tensors)
        self._released.append(req.key)

    def finish(self, key: int, reason: str = "abort", keep_state: bool = True
               ) -> EngineRequest | None:
        """Remove a request wherever it is (finished, aborted or failed).

        With a prefix cache its computed ids stay in the radix tree; a request that finished
        normally (``stop`` / ``length``) first runs one commit step when the anchor policy asks
        for generation-end checkpoints (then its runner state is released by that step, see
        :meth:`drain_released`).

        Args:
            key: the request.
            reason: its finish reason.
            keep_state: False when the runner's state is unusable (a failed forward).

        Returns:
            The removed request, or None when it was not queued or running.
        """
        req = self.get(key)
        if req is None:
            return None
        was_running = req in self.running
        if was_running:
            self.running.remove(req)
        else:
            self.waiting.remove(req)
        req.status = RequestStatus.FINISHED
        prefix = self.prefix
        if prefix is None or not was_running:
            return req
        if (reason in ("stop", "length") and keep_state and prefix.wants_generation_end(key)
                and req.output_ids and req.num_computed_tokens == req.num_tokens - 1):
            self.committing.append(req)
            return req
        # a tail checkpoint of the live state: after an abort (the client may retry), or at a
        # normal finish only when the anchor policy asks for generation-end checkpoints
        tail = keep_state and (reason not in ("stop", "length") or prefix.wants_generation_end(key))
        prefix.release(key, req.token_slice(0, req.num_tokens), req.num_computed_tokens,
                       self._state_tensors(key) if tail else None)
        return req
