"""AsyncEngine: queueing, abort (waiting / running / cancelled), errors, loop death, shutdown."""

from __future__ import annotations

import asyncio
import time

import pytest

from freetoken.core import GenerationOutput, GenerationRequest
from freetoken.engine.async_engine import AsyncEngine
from freetoken.prefix.build import CacheConfig
from freetoken.engine.engine import Engine

from tests.engine.fake_model import RecurrentLM
from tests.engine.helpers import ids_of, info, request, run_alone, text_of, tokenizer

V = tokenizer().vocab_size


async def _collect(engine: AsyncEngine, req: GenerationRequest) -> list[GenerationOutput]:
    return [out async for out in engine.generate(req)]


def test_concurrent_requests_queue_and_match_running_alone(start_engine) -> None:
    reqs = [request([5, 6, 7], rid="a", temperature=0.9, seed=1, max_tokens=12),
            request([8, 9], rid="b", max_tokens=10),
            request([5, 6, 7], rid="c", temperature=0.9, seed=1, max_tokens=12)]
    alone = [ids_of(run_alone(Engine(RecurrentLM(V, seed=3), tokenizer(), info(eos=())), r)) for r in reqs]
    model = RecurrentLM(V, seed=3)
    engine = start_engine(model)

    async def main():
        return await asyncio.gather(*(_collect(engine, r) for r in reqs))

    results = asyncio.run(main())
    assert [ids_of(r) for r in results] == alone
    assert alone[0] == alone[2] and len(alone[1]) == 10
    assert [r[-1].finish_reason for r in results] == ["length"] * 3
    assert all(c.request_id == req.request_id for r, req in zip(results, reqs) for c in r)
    # One request at a time: each prefill starts on an empty state after the previous request.
    prefills = [(first, n) for first, before, n in model.calls if before == 0]
    assert prefills == [(5, 3), (8, 2), (5, 3)]
    assert len(model.calls) == 3 + 11 + 9 + 11


def test_abort_of_a_waiting_request_removes_it_from_the_queue(start_engine) -> None:
    model = RecurrentLM(V, delay_s=0.01)
    engine = start_engine(model, cache=CacheConfig(max_running_requests=1))

    async def main():
        a = asyncio.create_task(_collect(engine, request([1, 2], rid="a", max_tokens=60)))
        await asyncio.sleep(0.05)  # a is running
        b = asyncio.create_task(_collect(engine, request([4242, 2], rid="b", max_tokens=20)))
        await asyncio.sleep(0.02)  # b is queued behind a
        b.cancel()
        with pytest.raises(asyncio.CancelledError):
            await b
        c = await _collect(engine, request([3, 2], rid="c", max_tokens=2))
        return await a, c

    a, c = asyncio.run(main())
    assert a[-1].finish_reason == "length" and len(ids_of(a)) == 60
    assert c[-1].finish_reason == "length"
    assert all(first != 4242 for first, _, _ in model.calls)  # b never reached the model


def test_closing_a_running_stream_aborts_it_and_the_next_request_starts_promptly(start_engine) -> None:
    model = RecurrentLM(V, delay_s=0.01)
    engine = start_engine(model)

    async def main():
        stream = engine.generate(request([1, 2], rid="long", max_tokens=2000))
        got = [await stream.__anext__() for _ in range(3)]
        await stream.aclose()
        started = time.perf_counter()
        nxt = await _collect(engine, request([7, 8], rid="next", max_tokens=3))
        return got, nxt, time.perf_counter() - started

    got, nxt, waited = asyncio.run(main())
    assert len(got) == 3 and got[-1].finish_reason is None
    assert nxt[-1].finish_reason == "length" and len(ids_of(nxt)) == 3
    assert waited < 1.0  # the 2000-token request would have taken ~20 s
    long_calls = [c for c in model.calls if c[0] != 7 and c[2] == 1]
    assert len(long_calls) < 50  # stopped within a few steps of the close, not after 2000
    assert engine._engine.runner.num_live_states == 0


def test_cancelling_the_consuming_task_aborts_a_running_request(start_engine) -> None:
    model = RecurrentLM(V, delay_s=0.01)
    engine = start_engine(model)

    async def main():
        seen: list[GenerationOutput] = []

        async def consume():
            async for out in engine.generate(request([1], rid="x", max_tokens=5000)):
                seen.append(out)

        task = asyncio.create_task(consume())
        while len(seen) < 2:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await _collect(engine, request([9], rid="y", max_tokens=2))

    after = asyncio.run(main())
    assert after[-1].finish_reason == "length"
    assert len(model.calls) < 30


def test_model_error_finishes_with_error_and_engine_keeps_serving(start_engine) -> None:
    engine = start_engine(RecurrentLM(V, fail_on_token=77))

    async def main():
        return (await _collect(engine, request([1, 77], rid="bad")),
                await _collect(engine, request([1, 2], rid="ok", max_tokens=4)))

    bad, ok = asyncio.run(main())
    assert [(c.finish_reason, c.error) for c in bad] == [("error", "RuntimeError: injected failure on token 77")]
    assert ok[-1].finish_reason == "length" and len(ids_of(ok)) == 4
    assert engine.is_healthy()


def test_dead_loop_fails_requests_and_reports_unhealthy(start_engine) -> None:
    engine = start_engine(RecurrentLM(V))

    def boom():
        raise RuntimeError("boom")

    engine._engine.scheduler.schedule = boom
    out = asyncio.run(_collect(engine, request([1, 2], rid="doomed")))
    assert [(c.finish_reason, c.error) for c in out] == [("error", "engine loop died: RuntimeError: boom")]
    engine._thread.join(2)
    assert not engine.is_healthy()
    later = asyncio.run(_collect(engine, request([1, 2], rid="later")))
    assert [(c.finish_reason, c.error, c.prompt_tokens) for c in later] == [
        ("error", "engine loop died: RuntimeError: boom", 2)
    ]


def test_generate_validates_before_iteration(start_engine) -> None:
    engine = start_engine(RecurrentLM(V))
    with pytest.raises(ValueError, match="maximum context length is 4096 tokens, but the prompt has 4096"):
        engine.generate(request([1] * 4096))
    with pytest.raises(ValueError, match="^The prompt is empty"):
        engine.generate(request([]))


def test_shutdown_aborts_in_flight_requests(start_engine) -> None:
    engine = start_engine(RecurrentLM(V, delay_s=0.01))

    async def main():
        stream = engine.generate(request([1, 2], rid="s", max_tokens=5000))
        first = await stream.__anext__()
        await asyncio.get_running_loop().run_in_executor(None, engine.shutdown)
        rest = [out async for out in stream]
        return first, rest

    first, rest = asyncio.run(main())
    assert first.finish_reason is None and rest[-1].finish_reason == "abort"
    assert not engine.is_healthy()
    after = asyncio.run(_collect(engine, request([1], rid="t")))
    assert [(c.finish_reason, c.error) for c in after] == [("error", "the engine is shut down")]


def test_stop_streams_ends_every_open_stream_with_its_message(start_engine) -> None:
    model = RecurrentLM(V, delay_s=0.01)
    engine = start_engine(model)

    async def main():
        streams = [engine.generate(request([1, k], rid=f"s{k}", max_tokens=5000)) for k in (2, 3)]
        firsts = [await s.__anext__() for s in streams]
        engine.stop_streams("the server is shutting down")
        rests = [[out async for out in s] for s in streams]
        return firsts, rests, await _collect(engine, request([9], rid="after", max_tokens=2))

    firsts, rests, after = asyncio.run(main())
    assert all(f.finish_reason is None for f in firsts)
    for rest, rid in zip(rests, ("s2", "s3")):
        assert [(c.request_id, c.token_ids, c.finish_reason, c.error) for c in rest[-1:]] == [
            (rid, (), "abort", "the server is shutting down")]
        assert len(rest) < 10  # ended at once, not after 5000 tokens
    assert after[-1].finish_reason == "length" and engine.is_healthy()
    assert engine._streams == {}


def test_streamed_text_matches_sync_engine(start_engine) -> None:
    req = request(tokenizer().encode("Once upon a time"), temperature=0.8, seed=11, max_tokens=30)
    sync = run_alone(Engine(RecurrentLM(V, seed=4), tokenizer(), info(eos=())), req)
    streamed = asyncio.run(_collect(start_engine(RecurrentLM(V, seed=4)), req))
    assert text_of(streamed) == text_of(sync) == tokenizer().decode(ids_of(sync), skip_special_tokens=True)
    assert [c.completion_tokens for c in streamed] == list(range(1, 31))
