"""The asyncio front of the engine: one background thread runs the engine loop.

Threading model: the loop thread alone touches the :class:`Engine` (scheduler, runner, model).
Other threads talk to it through a command inbox (``add`` / ``abort`` / ``call`` / ``stop``); the
loop drains the inbox before every step, so an abort lands within one step (at most one prefill
chunk) and a ``call`` (:meth:`AsyncEngine.run_between_steps`) runs between two steps. Output
chunks cross back with ``loop.call_soon_threadsafe`` into the asyncio.Queue of the caller's event
loop. The loop blocks on the inbox while idle.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import itertools
import logging
import queue
import threading
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import torch

from freetoken.core import EngineInfo, GenerationOutput, GenerationRequest
from freetoken.engine.client import EngineClient, EngineDeadError
from freetoken.engine.context_limit import check_max_model_len
from freetoken.engine.counters import EngineCounters
from freetoken.engine.engine import Engine
from freetoken.engine.recent import RequestTiming
from freetoken.engine.validate import validate_request
from freetoken.models.base import CausalLM
from freetoken.tokenizer.tokenizer import Tokenizer

if TYPE_CHECKING:
    from freetoken.models.load_progress import LoadStep
    from freetoken.offload.control import MoeRuntimeControl

T = TypeVar("T")
logger = logging.getLogger("freetoken.engine")

_STOP = ("stop",)


def describe_prefix_cache(prefix, cache, max_model_len: int) -> str:
    """One start-up line: KV pool size, batching limit and checkpoint capacity."""
    pool = prefix.pool
    kv_bytes = pool.num_slots * pool.layout.bytes_per_token()
    line = (f"KV cache: {pool.num_pages} pages x {pool.page_size} tokens = {pool.num_slots} tokens "
            f"({kv_bytes / 2**20:.1f} MiB), up to {cache.max_running_requests} running requests, "
            f"prefix reuse {'on' if cache.prefix_reuse else 'off'}")
    if prefix.store is not None:
        per = prefix.store.layout.bytes_per_checkpoint()
        line += (f"; recurrent-state checkpoints ({per / 2**20:.2f} MiB each): "
                 f"{cache.checkpoint_slots} device slots + {cache.checkpoint_host_bytes / 2**20:.0f} "
                 f"MiB host tier, anchors {cache.anchors}")
    if pool.num_slots < max_model_len:
        line += f"; requests longer than {pool.num_slots - 1} tokens will be refused"
    return line


def pool_context_limit(num_slots: int, page_size: int) -> int:
    """Longest sequence (prompt + output, tokens) one request can always finish alone in a KV pool
    of ``num_slots`` token slots.

    A request that reuses a cached prefix ending inside a page cannot write into that shared page:
    its own tokens start on fresh pages, so up to one page of slots is lost to the split, and the
    generation-end commit step writes one slot past the last token. Two pages of slack cover both
    (at least 1 token is always allowed).
    """
    return max(1, num_slots - 2 * page_size)


class AsyncEngine(EngineClient):
    """:class:`EngineClient` over an :class:`Engine` running in a daemon thread.

    Args:
        model: the causal LM (on its device, eval mode).
        tokenizer: its tokenizer.
        info: model facts (max_model_len, vocab size, EOS ids) exposed to the API layer.
        max_num_batched_tokens: prefill chunk size / token budget per step.
        device: where inputs and generators live (default: the model's device).
        moe: the offloaded MoE runtime's control surface (None: no offload runtime); exposed
            as ``self.moe`` for the admin endpoints, which call it via :meth:`run_between_steps`.
        routing_recorder: a ``RoutingRecorder`` (``--record-routing``); saved at shutdown.
        cache: KV pool / checkpoint / batching settings (``freetoken.prefix.build.CacheConfig``).
    """

    def __init__(
        self,
        model: CausalLM,
        tokenizer: Tokenizer,
        info: EngineInfo,
        *,
        max_num_batched_tokens: int = 2048,
        device: str | None = None,
        moe: MoeRuntimeControl | None = None,
        routing_recorder=None,
        cache=None,
    ) -> None:
        self.info = info
        self.tokenizer = tokenizer
        self.moe = moe
        self.routing_recorder = routing_recorder
        self.memory_plan = None  # freetoken serve's MemoryPlan (GET /v1/freetoken/memory)
        self._engine = Engine(
            model, tokenizer, info, max_num_batched_tokens=max_num_batched_tokens, device=device,
            routing_recorder=routing_recorder, cache=cache,
        )
        prefix = self._engine.prefix
        if prefix is not None:
            self.kv_page_bytes = prefix.pool.layout.bytes_per_token() * prefix.pool.page_size
            fit = pool_context_limit(prefix.pool.num_slots, prefix.pool.page_size)
            if fit < info.max_model_len:
                # a request must fit the KV pool whole: advertise that as the context length, so
                # the server answers an over-long prompt with its usual 400
                # (context_length_exceeded) instead of a request that can never finish
                self.info = dataclasses.replace(info, max_model_len=fit)
        self._inbox: queue.SimpleQueue[tuple] = queue.SimpleQueue()
        self._keys = itertools.count()
        self._lock = threading.Lock()
        self._failure: str | None = None
        self._closed = False
        self._streams: dict[int, Callable[[str], None]] = {}
        self._thread = threading.Thread(target=self._run, name="freetoken-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
        max_model_len: int | None = None,
        progress: Callable[[str], None] | None = None,
        max_num_batched_tokens: int = 2048,
        moe=None,
        bandwidths: tuple[float, float] | None = None,
        record_routing: str | Path | None = None,
        cache=None,
        on_stage: Callable[[str], None] | None = None,
        on_step: Callable[[LoadStep], None] | None = None,
        packed=None,
    ) -> "AsyncEngine":
        """Load a checkpoint directory (weights, config and tokenizer) and start the engine.

        Args:
            path: HF checkpoint directory.
            dtype: compute dtype of the weights.
            device: ``"cpu"`` or ``"cuda[:i]"``.
            max_model_len: context limit; default and upper bound is the config's
                ``max_position_embeddings``.
            progress: called with human-readable load progress lines (the CLI prints them).
            max_num_batched_tokens: prefill chunk size.
            moe: a ``freetoken.offload.backend.MoeConfig`` (None: every expert resident).
            bandwidths: profiled ``(B_P, B_H)`` GB/s for the hybrid miss split.
            record_routing: write every MoE layer's top-k ids to this ``.npz`` (at shutdown).
            cache: KV pool / checkpoint / batching settings (``CacheConfig``; None: defaults).
            on_stage: called with each load stage as it starts: ``"tokenizer"``, ``"weights"``
                (building the model and reading the checkpoint), ``"experts"`` (every tensor
                read: expert banks quantised, pinned and cached), ``"engine"`` (KV pool, loop).
            on_step: called with a :class:`LoadStep` after every tensor read (bytes so far;
                the banks' later stages go to the ``progress`` bars and lines only).
            packed: ``path``'s packed manifest when the caller read it already (None: read by
                the loader when ``path`` is packed).

        Raises:
            FileNotFoundError, ValueError: from the model loader or tokenizer (missing files,
                unsupported architecture), or ``max_model_len`` < 2 or above the config's limit.
        """
        from freetoken.heap import keep_freed_heap
        from freetoken.models.config import ModelConfig
        from freetoken.models.load_progress import load_reporter
        from freetoken.models.registry import load_model
        from freetoken.offload.resident import resident_experts

        say = progress or (lambda _message: None)
        stage = on_stage or (lambda _name: None)
        path = Path(path)
        config = ModelConfig.from_file(path)
        limit = check_max_model_len(config, path, max_model_len)
        stage("tokenizer")
        say(f"reading tokenizer from {path}")
        tokenizer = Tokenizer.from_pretrained(path)
        say(f"loading {config.model_type} weights ({config.num_hidden_layers} layers, "
            f"{config.num_experts} experts per MoE layer)")
        started = time.perf_counter()
        stage("weights")
        reporter = load_reporter(say, terminal=sys.stderr.isatty()) if progress is not None else None

        def step(s: LoadStep) -> None:
            if reporter is not None:
                reporter(s)
            if s.stage != "read":  # the banks' own stages: on the bars and lines only
                return
            if on_step is not None:
                on_step(s)
            if s.done_bytes == s.total_bytes:  # the rest of load_model places the experts
                stage("experts")

        try:
            model = load_model(path, dtype=dtype, device=device, moe=moe, bandwidths=bandwidths,
                               progress=step if progress is not None or on_step or on_stage
                               else None, packed=packed)
        finally:
            if reporter is not None:
                reporter.close()
        say(f"weights loaded in {time.perf_counter() - started:.1f}s")
        stage("engine")
        keep_freed_heap()  # the weights keep their mappings; a step's temporaries are reused
        runtime = getattr(model, "moe_runtime", None)
        if runtime is not None:
            s = runtime.stats()
            say(f"moe backend {s.backend}: {s.num_slots} of {s.total_experts} experts cached on "
                f"{s.device} ({s.cache_bytes / 2**20:.1f} MiB), host banks "
                f"{s.bank_bytes / 2**20:.1f} MiB{' pinned' if s.banks_pinned else ''}, "
                f"policy {s.policy}")
        banked = resident_experts(model)
        if banked is not None:
            say(f"moe backend resident: experts kept {banked.format} on the CPU "
                f"({banked.bytes / 2**20:.1f} MiB), cpu activations {banked.cpu_activations}")
        recorder = None
        if record_routing is not None:
            from freetoken.offload.recorder import RoutingRecorder

            recorder = RoutingRecorder(
                record_routing, num_layers=len(model.moe_blocks()), num_experts=config.num_experts,
                top_k=config.num_experts_per_tok, model=str(path))
            say(f"recording routing to {record_routing}")
        eos = tuple(dict.fromkeys((*tokenizer.eos_token_ids, *config.eos_token_ids)))
        info = EngineInfo(
            model_path=str(path),
            model_type=config.model_type,
            max_model_len=max_model_len or limit,
            vocab_size=config.vocab_size,
            eos_token_ids=eos,
            resident_experts=banked,
        )
        engine = cls(model, tokenizer, info, max_num_batched_tokens=max_num_batched_tokens,
                     device=device, moe=runtime, routing_recorder=recorder, cache=cache)
        prefix = engine._engine.prefix
        if prefix is not None:
            say(describe_prefix_cache(prefix, engine._engine.cache_config, info.max_model_len))
        return engine

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        """Validate ``request`` now, then stream its chunks when iterated (see EngineClient).

        The request is queued on the first ``__anext__``; closing the iterator or cancelling
        the consuming task aborts it. If the engine loop has died the stream is a single
        ``error`` chunk.

        Raises:
            ValueError: invalid request (``ContextLengthError`` for an empty or too long prompt).
        """
        validate_request(request, self.info)
        return self._stream(request)

    def is_healthy(self) -> bool:
        """True while the loop thread runs and has not failed."""
        return self._failure is None and not self._closed and self._thread.is_alive()

    async def run_between_steps(self, fn: Callable[[], T]) -> T:
        """Run ``fn()`` on the loop thread between two steps; its result or exception comes back.

        ``fn`` runs when the loop next drains its inbox: at once when idle, else right after
        the current step. Cancelling the awaiting task before ``fn`` started means it never
        runs. ``fn`` should be quick: every request waits while it runs.

        Raises:
            EngineDeadError: the loop has died or the engine is shut down (``fn`` did not run).
            Exception: whatever ``fn`` raised.
        """
        future: concurrent.futures.Future = concurrent.futures.Future()
        if not self._post(("call", fn, future)):
            raise EngineDeadError(self._failure or "the engine is shut down")
        return await asyncio.wrap_future(future)

    async def prefix_path_stats(self, token_ids: tuple[int, ...]) -> dict[str, int] | None:
        """The prefix cache's view of ``token_ids`` (read on the loop thread between steps);
        None with ``--no-prefix-reuse``.

        Raises:
            EngineDeadError: the loop has died or the engine is shut down.
        """
        prefix = self._engine.prefix
        if prefix is None:
            return None
        return await self.run_between_steps(lambda: prefix.path_stats(token_ids))

    def counters(self) -> EngineCounters:
        """Request and token counters (read without waiting for the loop)."""
        return self._engine.counters()

    def recent_requests(self) -> tuple[RequestTiming, ...]:
        """The last finished requests, oldest first (read without waiting for the loop)."""
        return self._engine.recent.snapshot()

    async def prefix_checkpoint_depths(self, token_ids: tuple[int, ...]) -> tuple[int, ...] | None:
        """Depths (tokens) of the checkpoints on ``token_ids``'s cached path (read on the loop
        thread between steps); None with ``--no-prefix-reuse``.

        Raises:
            EngineDeadError: the loop has died or the engine is shut down.
        """
        prefix = self._engine.prefix
        if prefix is None:
            return None
        return await self.run_between_steps(lambda: prefix.checkpoint_depths(token_ids))

    def shutdown(self, timeout: float = 10.0) -> None:
        """Abort every request, stop the loop thread and wait up to ``timeout`` seconds for it."""
        with self._lock:
            self._closed = True
        self._inbox.put(_STOP)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        if self.routing_recorder is not None:
            path = self.routing_recorder.close()
            logger.info("routing recorded to %s", path)

    async def _stream(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue[GenerationOutput] = asyncio.Queue()
        key = next(self._keys)

        def sink(out: GenerationOutput) -> None:
            try:
                loop.call_soon_threadsafe(chunks.put_nowait, out)
            except RuntimeError:  # the consumer's event loop is closed: nobody is listening
                self._post(("abort", key))

        if not self._post(("add", key, request, sink, time.perf_counter())):
            yield self._error_chunk(request)
            return

        def stop(message: str) -> None:
            chunks.put_nowait(dataclasses.replace(self._error_chunk(request),
                                                  finish_reason="abort", error=message))
            self._post(("abort", key))

        self._streams[key] = lambda message: loop.call_soon_threadsafe(stop, message)
        finished = False
        try:
            while not finished:
                out = await chunks.get()
                finished = out.finish_reason is not None
                yield out
        finally:
            self._streams.pop(key, None)
            if not finished:
                self._post(("abort", key))

    def stop_streams(self, message: str) -> None:
        """End every open stream at once with an ``abort`` chunk whose ``error`` is ``message``,
        and abort its request (the server is stopping: clients get an error, not a cut stream).

        Safe from a signal handler or any thread: it only schedules work on each stream's event
        loop (a request whose prefill step is running is aborted when the step ends)."""
        for stop in list(self._streams.values()):
            try:
                stop(message)
            except RuntimeError:  # that stream's event loop is closed: nobody is listening
                pass

    def _error_chunk(self, request: GenerationRequest) -> GenerationOutput:
        reason = self._failure or "the engine is shut down"
        return GenerationOutput(
            request.request_id, (), "", finish_reason="error",
            prompt_tokens=len(request.prompt_ids), error=reason,
        )

    def _post(self, command: tuple) -> bool:
        with self._lock:
            if self._failure is not None or self._closed:
                return False
            self._inbox.put(command)
            return True

    def _run(self) -> None:
        try:
            while self._drain(block=not self._engine.has_unfinished()):
                self._engine.step()
        except BaseException as exc:  # noqa: BLE001 - report, then fail every waiting consumer
            logger.exception("engine loop died")
            self._die(f"engine loop died: {type(exc).__name__}: {exc}")

    def _drain(self, block: bool) -> bool:
        """Apply queued commands (waiting for one when ``block``); False on ``stop``."""
        try:
            command = self._inbox.get() if block else self._inbox.get_nowait()
            while True:
                if command[0] == "stop":
                    self._engine.abort_all()
                    return False
                self._apply(command)
                command = self._inbox.get_nowait()
        except queue.Empty:
            return True

    def _apply(self, command: tuple) -> None:
        if command[0] == "abort":
            self._engine.abort_request(command[1])
            return
        if command[0] == "call":
            _call(command[1], command[2])
            return
        _, key, request, sink, arrival = command
        try:
            self._engine.add_request(key, request, sink, arrival)
        except ValueError as exc:
            sink(GenerationOutput(request.request_id, (), "", finish_reason="error",
                                  prompt_tokens=len(request.prompt_ids), error=str(exc)))

    def _die(self, message: str) -> None:
        with self._lock:
            self._failure = message
        try:
            self._engine.abort_all("error", message)
        except Exception:  # noqa: BLE001 - best effort; the engine state may be broken
            logger.exception("could not fail the engine's requests")
        while True:
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return
            if command[0] == "add":
                _, _, request, sink, _ = command
                sink(self._error_chunk(request))
            elif command[0] == "call" and command[2].set_running_or_notify_cancel():
                command[2].set_exception(EngineDeadError(message))


def _call(fn: Callable[[], object], future: concurrent.futures.Future) -> None:
    """Run ``fn`` into ``future`` unless its caller cancelled it; never raises."""
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(fn())
    except BaseException as exc:  # noqa: BLE001 - the caller gets it; the loop must live on
        future.set_exception(exc)
