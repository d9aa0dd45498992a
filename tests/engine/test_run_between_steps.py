"""``AsyncEngine.run_between_steps`` (functions run on the loop thread, never during a step;
results, exceptions, cancellation, a dead or shut-down loop) and the engine counters."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace

import pytest
import torch

from freetoken.engine.async_engine import AsyncEngine
from freetoken.engine.client import EngineDeadError
from freetoken.engine.counters import EngineCounters
from freetoken.engine.engine import Engine

from tests.engine.fake_model import RecurrentLM
from tests.engine.helpers import ids_of, info, request, run_alone, tokenizer
from tests.server.srv_moe import FakeMoe

V = tokenizer().vocab_size


async def _collect(engine: AsyncEngine, req) -> list:
    return [out async for out in engine.generate(req)]


def test_idle_engine_runs_the_function_at_once_on_its_thread(start_engine) -> None:
    moe = FakeMoe()
    engine = start_engine(RecurrentLM(V), moe=moe)
    assert engine.moe is moe

    async def main():
        return await engine.run_between_steps(lambda: (threading.current_thread().name, 42))

    assert asyncio.run(main()) == ("freetoken-engine", 42)
    stats = asyncio.run(engine.run_between_steps(moe.stats))
    assert stats.num_slots == 96 and moe.threads == ["freetoken-engine"]


def test_functions_run_between_steps_while_a_generation_continues(start_engine) -> None:
    req = request([5, 6, 7], rid="g", temperature=0.9, seed=2, max_tokens=40)
    alone = ids_of(run_alone(Engine(RecurrentLM(V, seed=1), tokenizer(), info(eos=())), req))
    model = RecurrentLM(V, seed=1, delay_s=0.005)
    engine = start_engine(model)
    seen: list[tuple[str, int, int]] = []

    def probe() -> int:
        before = len(model.calls)
        time.sleep(0.01)  # a step running concurrently would add a call meanwhile
        seen.append((threading.current_thread().name, before, len(model.calls)))
        return before

    async def main():
        task = asyncio.create_task(_collect(engine, req))
        results = []
        while not task.done():
            results.append(await engine.run_between_steps(probe))
            await asyncio.sleep(0.003)
        return await task, results

    out, results = asyncio.run(main())
    assert ids_of(out) == alone and out[-1].finish_reason == "length"
    assert len(seen) >= 5 and results == [b for _, b, _ in seen]
    assert all(name == "freetoken-engine" and before == after for name, before, after in seen)
    assert any(0 < before < len(model.calls) for _, before, _ in seen)  # some ran mid-generation


def test_exceptions_reach_the_caller_and_the_engine_keeps_serving(start_engine) -> None:
    engine = start_engine(RecurrentLM(V))
    error = ValueError("boom")

    def fail():
        raise error

    async def main():
        with pytest.raises(ValueError) as caught:
            await engine.run_between_steps(fail)
        return caught.value, await _collect(engine, request([1, 2], max_tokens=3))

    raised, out = asyncio.run(main())
    assert raised is error
    assert out[-1].finish_reason == "length" and len(ids_of(out)) == 3 and engine.is_healthy()


def test_a_cancelled_call_never_runs(start_engine) -> None:
    model = RecurrentLM(V, delay_s=0.2)
    engine = start_engine(model)
    ran: list[str] = []

    async def main():
        gen = asyncio.create_task(_collect(engine, request([1, 2], max_tokens=2)))
        await asyncio.sleep(0.05)  # the prefill step is sleeping in the model
        call = asyncio.create_task(engine.run_between_steps(lambda: ran.append("ran")))
        await asyncio.sleep(0.01)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await gen
        return await engine.run_between_steps(lambda: "after")

    assert asyncio.run(main()) == "after" and ran == []


def test_shut_down_engine_refuses(start_engine) -> None:
    engine = start_engine(RecurrentLM(V))
    engine.shutdown()
    with pytest.raises(EngineDeadError, match="^the engine is shut down$") as caught:
        asyncio.run(engine.run_between_steps(lambda: 1))
    assert isinstance(caught.value, RuntimeError)


def test_loop_death_fails_pending_and_later_calls(start_engine) -> None:
    engine = start_engine(RecurrentLM(V))

    def boom():
        time.sleep(0.2)
        raise RuntimeError("boom")

    engine._engine.scheduler.schedule = boom
    ran: list[int] = []

    async def main():
        gen = asyncio.create_task(_collect(engine, request([1, 2])))
        await asyncio.sleep(0.05)  # the loop is inside schedule()
        with pytest.raises(EngineDeadError, match="^engine loop died: RuntimeError: boom$"):
            await engine.run_between_steps(lambda: ran.append(1))
        await gen
        with pytest.raises(EngineDeadError, match="^engine loop died: RuntimeError: boom$"):
            await engine.run_between_steps(lambda: ran.append(2))

    asyncio.run(main())
    assert ran == []


def _without_histograms(counters: EngineCounters) -> tuple[EngineCounters, tuple[int, ...]]:
    """The counters with empty histograms, and the histograms' observation counts (TTFT,
    inter-token, queue, prefill)."""
    empty = EngineCounters()
    counts = (counters.time_to_first_token.count, counters.inter_token_latency.count,
              counters.queue_time.count, counters.prefill_throughput.count)
    return replace(counters, time_to_first_token=empty.time_to_first_token,
                   inter_token_latency=empty.inter_token_latency, queue_time=empty.queue_time,
                   prefill_throughput=empty.prefill_throughput), counts


def test_counters_count_requests_tokens_and_queue(start_engine) -> None:
    engine = Engine(RecurrentLM(V), tokenizer(), info(eos=()), max_num_batched_tokens=4)
    assert engine.counters() == EngineCounters()
    chunks: list = []
    engine.add_request(0, request(list(range(1, 11)), max_tokens=3), chunks.append)
    engine.add_request(1, request([1, 2], max_tokens=5), chunks.append)
    engine.add_request(2, request([3], max_tokens=5), chunks.append)
    assert engine.counters() == EngineCounters(requests_added=3, running=0, waiting=3)
    engine.step()  # first prefill chunk of request 0 (4 of 10 prompt tokens)
    now = engine.counters()
    assert (now.prompt_tokens, now.prompt_tokens_recomputed, now.running, now.waiting) == \
        (10, 4, 1, 2)
    assert _without_histograms(now)[1] == (0, 0, 1, 0)  # request 0 left the queue
    engine.abort_request(2)  # never started: no prompt tokens, no queue time
    while engine.step():
        pass
    assert _without_histograms(engine.counters()) == (EngineCounters(
        requests_added=3, finished={"stop": 0, "length": 2, "abort": 1, "error": 0},
        prompt_tokens=10 + 2, prompt_tokens_recomputed=10 + 2, generation_tokens=3 + 5,
        running=0, waiting=0), (2, (3 - 1) + (5 - 1), 2, 2))


def test_async_engine_exposes_the_counters(start_engine) -> None:
    engine = start_engine(RecurrentLM(V))
    asyncio.run(_collect(engine, request([1, 2, 3], max_tokens=4)))
    assert _without_histograms(engine.counters()) == (EngineCounters(
        requests_added=1, finished={"stop": 0, "length": 1, "abort": 0, "error": 0},
        prompt_tokens=3, prompt_tokens_recomputed=3, generation_tokens=4), (1, 3, 1, 1))


@pytest.mark.parametrize("arch", ["qwen3_moe"])
def test_tiny_checkpoint_generation_is_unchanged_by_calls_between_steps(arch, tiny_checkpoint
                                                                        ) -> None:
    engine = AsyncEngine.from_pretrained(tiny_checkpoint(arch), dtype=torch.float32,
                                         max_model_len=128, max_num_batched_tokens=8)
    try:
        prompt = tokenizer().encode("<|im_start|>user\nName three colours.<|im_end|>\n"
                                    "<|im_start|>assistant\n")
        req = request(prompt, max_tokens=24, ignore_eos=True)
        reference = asyncio.run(_collect(engine, req))
        threads: list[str] = []

        def probe() -> int:
            threads.append(threading.current_thread().name)
            return engine.counters().generation_tokens

        async def main():
            task = asyncio.create_task(_collect(engine, req))
            seen = []
            while not task.done():
                seen.append(await engine.run_between_steps(probe))
                await asyncio.sleep(0)
            return await task, seen

        out, seen = asyncio.run(main())
        assert ids_of(out) == ids_of(reference) and len(ids_of(out)) == 24
        assert set(threads) == {"freetoken-engine"} and len(threads) >= 3
        assert seen == sorted(seen) and 24 <= seen[-1] <= 48  # token count grew between calls
        assert any(24 < n < 48 for n in seen)  # at least one call landed mid-generation
    finally:
        engine.shutdown()
