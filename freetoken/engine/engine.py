"""The synchronous engine core: ``step() = schedule -> execute -> update``.

Request lifecycle:

1. :meth:`Engine.add_request` validates the request and queues it with an output sink.
2. :meth:`Engine.step` asks the :class:`Scheduler` for a :class:`ScheduledBatch` (decode
   steps of the running requests and prefill chunks, continuous batching), the
   :class:`ModelRunner` executes it and returns one :class:`ForwardOutput` per entry, and the
   update applies each: token accounting and checkpoints, then detokenisation and stop checks
   (:class:`RequestOutputProcessor`), then one :class:`GenerationOutput` chunk to the sink.
3. A finished, aborted or failed request leaves the scheduler (its computed ids stay in the
   prefix cache's radix tree), its model state is freed and one summary line is logged on
   ``freetoken.engine``.

Single-threaded: only the thread that owns the engine may call it (see ``async_engine``).
"""

from __future__ import annotations

import logging
import time

from freetoken.constrain.matcher import GrammarCompiler
from freetoken.core import EngineInfo, FinishReason, GenerationOutput, GenerationRequest
from freetoken.engine.batch import ForwardOutput, SeqWork
from freetoken.engine.counters import CounterBook, EngineCounters
from freetoken.engine.detokenizer import DetokenizerFactory
from freetoken.engine.output import RequestOutputProcessor
from freetoken.engine.recent import RecentRequests
from freetoken.engine.request import EngineRequest, OutputSink
from freetoken.engine.runner import ModelRunner, model_device
from freetoken.engine.scheduler import Scheduler, SchedulerConfig
from freetoken.engine.validate import validate_request
from freetoken.models.base import CausalLM
from freetoken.prefix.build import CacheConfig, build_prefix_cache
from freetoken.tokenizer.tokenizer import Tokenizer

logger = logging.getLogger("freetoken.engine")
PREFIX_STATS_INTERVAL_S = 0.5


class Engine:
    """Scheduler + model runner + per-request output processing.

    Args:
        model: the causal LM (on its device, eval mode).
        tokenizer: the model's tokenizer (detokenisation, logprob token strings).
        info: model facts; ``info.max_model_len`` bounds every sequence and
            ``info.eos_token_ids`` end generation unless ``ignore_eos``.
        max_num_batched_tokens: token budget per step (prefill chunk size).
        device: where inputs and generators live (default: the model's device).
        routing_recorder: optional ``freetoken.offload.recorder.RoutingRecorder``
            (``--record-routing``), handed to the model runner.
        cache: KV pool / checkpoint / batching settings (default ``CacheConfig()``); models
            without paged state run without prefix reuse.
    """

    def __init__(
        self,
        model: CausalLM,
        tokenizer: Tokenizer,
        info: EngineInfo,
        *,
        max_num_batched_tokens: int = 2048,
        device: str | None = None,
        routing_recorder=None,
        cache: CacheConfig | None = None,
    ) -> None:
        self.info = info
        self.tokenizer = tokenizer
        self.cache_config = cache = cache or CacheConfig()
        self.prefix = build_prefix_cache(model, tokenizer, info.max_model_len, cache,
                                         device if device is not None else model_device(model))
        self.runner = ModelRunner(model, device, sampleable_vocab=tokenizer.vocab_size,
                                  routing_recorder=routing_recorder, prefix=self.prefix)
        self.scheduler = Scheduler(
            SchedulerConfig(info.max_model_len, max_num_batched_tokens,
                            cache.max_running_requests),
            self.prefix, self.runner.recurrent_tensors,
        )
        self._detokenizers = DetokenizerFactory(tokenizer)
        self._grammars = GrammarCompiler(tokenizer, info.eos_token_ids)
        self._processors: dict[int, RequestOutputProcessor] = {}
        self._book = CounterBook()
        self.recent = RecentRequests()
        self._stats_at = 0.0
        self._refresh_prefix_stats(force=True)
        self.host_watcher = None  # shrinks the host checkpoint tier under memory pressure
        store = self.prefix.store if self.prefix is not None else None
        if store is not None and store.host_bytes and cache.checkpoint_host_floor:
            from freetoken.prefix.host_watcher import HostTierWatcher

            self.host_watcher = HostTierWatcher(store, cache.checkpoint_host_floor)

    def add_request(
        self,
        key: int,
        request: GenerationRequest,
        sink: OutputSink,
        arrival_time: float | None = None,
    ) -> None:
        """Queue ``request`` under the engine-unique ``key``; chunks go to ``sink``.

        Raises:
            ValueError: invalid request (see ``validate_request``), ``key`` already in use, or a
                ``sampling.grammar`` that does not compile (``GrammarError``).
        """
        validate_request(request, self.info)
        if key in self._processors:
            raise ValueError(f"request key {key} is already in use")
        grammar = request.sampling.grammar
        if grammar is not None:
            self.runner.constraints[key] = self._grammars.matcher(grammar)
        req = EngineRequest(key, request, sink)
        if arrival_time is not None:
            req.arrival_time = arrival_time
        self._processors[key] = RequestOutputProcessor(
            req, self.tokenizer, self._detokenizers(), self.info.eos_token_ids,
            self.info.max_model_len,
        )
        self.scheduler.add(req)
        self._book.on_added()

    def abort_request(self, key: int) -> bool:
        """Stop a waiting or running request (final chunk ``abort``); False if unknown."""
        found = self._finish(key, "abort")
        self._refresh_prefix_stats(force=not self.scheduler.has_unfinished())
        return found

    def abort_all(self, reason: FinishReason = "abort", error: str | None = None) -> None:
        """End every queued and running request with ``reason``."""
        for key in list(self._processors):
            self._finish(key, reason, error)

    def has_unfinished(self) -> bool:
        """True while a request is waiting or running."""
        return self.scheduler.has_unfinished()

    def counters(self) -> EngineCounters:
        """Snapshot of the request and token counters (safe to call from any thread)."""
        waiting = len(self.scheduler.waiting)
        return self._book.snapshot(len(self.scheduler.running), waiting)

    def step(self) -> bool:
        """Run one scheduling step (decode tokens and prefill chunks of the running requests).

        Returns:
            False when there was nothing to do.
        """
        if self.host_watcher is not None:
            self.host_watcher.check()
        batch = self.scheduler.schedule()
        for req, why in self.scheduler.drain_rejected():
            self._finish(req.key, "error", why, scheduled=False)
        for key in self.scheduler.drain_released():
            self.runner.release(key)
        if batch is None:
            return False
        self._mark_started(batch.entries)
        outputs = self.runner.execute(batch)
        for work, output in zip(batch.entries, outputs):
            try:
                self._update(work, output)
            except Exception as exc:  # noqa: BLE001 - a bug in output handling ends only this request
                logger.exception("output processing failed for request key %d", work.request_key)
                self._finish(work.request_key, "error", f"{type(exc).__name__}: {exc}")
        self._refresh_prefix_stats(force=not self.scheduler.has_unfinished())
        return True

    def _mark_started(self, entries: tuple[SeqWork, ...]) -> None:
        """Stamp the first step of requests that run for the first time (their queue time and
        whole prompt are counted once, not again after a preemption)."""
        now = time.perf_counter()
        for work in entries:
            if not work.new_state:
                continue
            req = self.scheduler.get(work.request_key)
            if req is not None and req.first_scheduled_time is None:
                req.first_scheduled_time = now
                self._book.on_started(req.num_prompt_tokens, req.num_cached_tokens,
                                      now - req.arrival_time)
                if req.request.report_admission:
                    self._emit(req, self._processors[req.key].admitted())

    def _observe_token(self, req: EngineRequest) -> None:
        """Latency of the token ``req`` just sampled: TTFT and prefill speed for its first,
        the gap since the previous one for the others."""
        if len(req.output_ids) > 1:
            self._book.on_next_token(req.inter_token_s)
            return
        started = req.first_scheduled_time if req.first_scheduled_time is not None else \
            req.arrival_time
        self._book.on_first_token(req.first_token_time - req.arrival_time,
                                  req.num_prefilled_tokens, req.first_token_time - started)

    def _refresh_prefix_stats(self, force: bool = False) -> None:
        """Copy the prefix cache's stats for ``/metrics`` (an O(nodes) walk: at most every
        ``PREFIX_STATS_INTERVAL_S`` while busy, and whenever the engine goes idle)."""
        now = time.monotonic()
        if self.prefix is None or (not force and now - self._stats_at < PREFIX_STATS_INTERVAL_S):
            return
        self._book.prefix = self.prefix.stats()
        self._stats_at = now

    def _update(self, work: SeqWork, output: ForwardOutput) -> None:
        if output.error is not None:
            if work.request_key in self._processors:
                self._finish(work.request_key, "error", output.error, keep_state=False)
            else:  # a commit step of a request that already finished
                self.scheduler.abandon_commit(work.request_key)
            return
        req = self.scheduler.update(work, output)
        if req is None:  # commit step done
            return
        self._book.on_step(work.num_computed_tokens, len(work.token_ids), req.num_prompt_tokens,
                           output.token_id is not None)
        if output.token_id is None:
            return
        self._observe_token(req)
        chunk = self._processors[req.key].on_token(output)
        if chunk.finish_reason is not None:
            self._retire(req.key, chunk.finish_reason)
        self._emit(req, chunk)

    def _finish(self, key: int, reason: FinishReason, error: str | None = None,
                keep_state: bool = True, scheduled: bool = True) -> bool:
        processor = self._processors.get(key)
        if processor is None:
            return False
        self._retire(key, reason, keep_state, scheduled)
        self._emit(processor.req, processor.final(reason, error))
        return True

    def _retire(self, key: int, reason: FinishReason, keep_state: bool = True,
                scheduled: bool = True) -> None:
        processor = self._processors.pop(key)
        self.runner.constraints.pop(key, None)
        committing = False
        if scheduled:
            self.scheduler.finish(key, reason, keep_state)
            committing = processor.req in self.scheduler.committing
        if not committing:
            self.runner.release(key)
        processor.req.finish_time = time.perf_counter()
        processor.req.log_finish(reason)
        self._book.on_finish(reason)
        self.recent.add(processor.req, reason)

    def _emit(self, req: EngineRequest, chunk: GenerationOutput) -> None:
        try:
            req.sink(chunk)
        except Exception:  # noqa: BLE001 - a broken consumer must not stop the engine
            logger.exception("output sink of request %s failed", req.request.request_id)
            if chunk.finish_reason is None:
                self._finish(req.key, "abort")
