"""Continuous batching and aborts with the prefix cache on the tiny checkpoints: concurrent
requests (one arriving mid-decode) give the tokens they give alone; an abort frees the step for
the next request at once; 100 abort cycles leak no KV page, lock, state or checkpoint."""

from __future__ import annotations

import random

import pytest

from freetoken.core import GenerationRequest, SamplingParams

from tests.prefix.engine_helpers import agent_turns, ids, make_engine, render, serve


def _request(key: int, prompt, max_tokens: int) -> GenerationRequest:
    return GenerationRequest(f"r{key}", tuple(prompt),
                             SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))


def _record_batches(engine) -> list[list[tuple[int, int]]]:
    seen: list[list[tuple[int, int]]] = []
    execute = engine.runner.execute

    def spy(batch):
        seen.append([(e.request_key, len(e.token_ids)) for e in batch.entries])
        return execute(batch)

    engine.runner.execute = spy
    return seen


@pytest.mark.parametrize("arch", ["qwen3_next", "qwen3_moe", "qwen3_5_moe", "glm4_moe", "gpt_oss"])
def test_concurrent_requests_and_a_late_arrival_match_running_alone(arch: str) -> None:
    prompts = [render(arch, agent_turns(n))[1] for n in (0, 1, 2)]
    prompts[2] = prompts[2][:-7]  # a different length and ending
    engine = make_engine(arch, budget=48)
    batches = _record_batches(engine)
    outs: dict[int, list] = {0: [], 1: [], 2: []}
    engine.add_request(0, _request(0, prompts[0], 12), outs[0].append)
    engine.add_request(1, _request(1, prompts[1], 12), outs[1].append)
    while not outs[0]:  # until the first request decodes
        assert engine.step()
    engine.add_request(2, _request(2, prompts[2], 12), outs[2].append)
    while engine.step():
        pass
    assert any(len(b) == 3 for b in batches)  # all three in one step
    assert any(sum(n for _, n in b) > len(b) and any(n == 1 for _, n in b) for b in batches)
    for key, prompt in enumerate(prompts):
        assert outs[key][-1].finish_reason == "length"
        alone = serve(make_engine(arch), prompt, key=0, max_tokens=12)
        assert ids(outs[key]) == ids(alone), key


def test_abort_mid_prefill_and_mid_decode_frees_the_next_step() -> None:
    engine = make_engine("qwen3_next", budget=32, max_running_requests=1)
    batches = _record_batches(engine)
    long_prompt = render("qwen3_next", agent_turns(3))[1]
    sink: list = []
    engine.add_request(0, _request(0, long_prompt, 50), sink.append)
    engine.step()  # first prefill chunk
    engine.abort_request(0)
    assert sink[-1].finish_reason == "abort"
    engine.add_request(1, _request(1, long_prompt[:40], 30), sink.append)
    engine.step()
    assert batches[-1][0][0] == 1  # the next step is the new request's
    while sink[-1].request_id != "r1" or not sink[-1].token_ids:
        engine.step()  # until it decodes
    # request 0's first chunk stayed in the tree with a tail checkpoint after its abort
    assert sink[-1].cached_tokens == 32
    engine.abort_request(1)
    engine.add_request(2, _request(2, long_prompt[:45], 2), sink.append)
    engine.step()
    assert batches[-1][0][0] == 2
    while engine.step():
        pass
    # request 1's prompt (its generation-start checkpoint) stayed too after its abort mid-decode
    assert sink[-1].request_id == "r2" and sink[-1].cached_tokens == 40


def test_hundred_abort_cycles_leak_nothing() -> None:
    engine = make_engine("qwen3_next", budget=24, page_size=4, anchors=None or _all())
    prefix = engine.prefix
    base = [render("qwen3_next", agent_turns(n))[1] for n in (0, 1, 2)]
    rng = random.Random(0)
    for cycle in range(100):
        for j in range(rng.randint(1, 3)):
            key = cycle * 10 + j
            prompt = rng.choice(base)[: rng.randint(5, 200)] + (rng.randint(10, 4000),)
            engine.add_request(key, _request(key, prompt, rng.randint(1, 6)), lambda _c: None)
        for _ in range(rng.randint(0, 4)):
            engine.step()
        for j in range(3):
            engine.abort_request(cycle * 10 + j)
        if cycle % 10 == 0:
            prefix.pool.check_invariants()
            prefix.tree.check_invariants()
    while engine.step():  # commit steps of requests that finished normally
        pass
    assert not engine.has_unfinished()
    assert engine.runner.num_live_states == 0
    assert prefix.num_requests == 0
    prefix.store.check_invariants()
    assert prefix.store.num_checkpoints > 0 and prefix.tree.num_tokens > 0
    prefix.tree.reset()  # nothing is locked: everything can go
    assert prefix.tree.num_tokens == 0 and prefix.store.num_checkpoints == 0
    assert prefix.pool.num_free_pages == prefix.pool.num_pages
    assert not prefix.pool.refcounts().any()


def _all():
    from freetoken.prefix.anchors import AnchorPolicy

    return AnchorPolicy.all()


def test_concurrent_streams_through_the_async_engine_match_running_alone() -> None:
    """Two streaming requests, then a third arriving while they decode (asyncio clients of the
    background engine loop, as the HTTP server uses it)."""
    import asyncio

    from freetoken.engine.async_engine import AsyncEngine
    from freetoken.models.tiny import cached_tiny

    prompts = [render("qwen3_next", agent_turns(n))[1] for n in (0, 1, 2)]
    engine = AsyncEngine.from_pretrained(cached_tiny("qwen3_next"), max_model_len=2048,
                                         max_num_batched_tokens=64)
    try:
        async def collect(key: int, started: asyncio.Event | None = None) -> list[int]:
            out: list[int] = []
            async for chunk in engine.generate(_request(key, prompts[key], 10)):
                out.extend(chunk.token_ids)
                if started is not None and out:
                    started.set()
            return out

        async def main() -> list[list[int]]:
            first_tokens = asyncio.Event()
            a = asyncio.create_task(collect(0, first_tokens))
            b = asyncio.create_task(collect(1))
            await first_tokens.wait()
            c = asyncio.create_task(collect(2))
            return list(await asyncio.gather(a, b, c))

        together = asyncio.run(main())
        # the late request reused the system prompt and task the first one had computed
        first_turns = len(render("qwen3_next", agent_turns(0))[1]) - 4
        assert engine.counters().cached_tokens >= first_turns
    finally:
        engine.shutdown()
    for key, prompt in enumerate(prompts):
        assert together[key] == ids(serve(make_engine("qwen3_next"), prompt, key=0, max_tokens=10))


def test_a_full_pool_preempts_and_every_request_still_matches_running_alone() -> None:
    """A KV pool of 24 pages for three 100-token prompts growing by 60 tokens each: decode steps
    run out of pages, the youngest request is preempted (its work stays in the tree) and later
    re-admitted; the engine keeps serving and every output equals the request run alone."""
    from tests.prefix.engine_helpers import tiny

    model = tiny("qwen3_next")[1]
    page_bytes = model.kv_layout().bytes_per_token() * 16
    engine = make_engine("qwen3_next", budget=256, kv_cache_bytes=24 * page_bytes)
    assert engine.prefix.pool.num_pages == 24
    base = render("qwen3_next", agent_turns(1))[1]
    prompts = [base[:100 - k] + (500 + k,) for k in range(3)]
    outs: dict[int, list] = {k: [] for k in range(3)}
    for k, prompt in enumerate(prompts):
        engine.add_request(k, _request(k, prompt, 60), outs[k].append)
    preempted = 0
    while engine.step():
        preempted = max(preempted, max((r.num_admissions for r in engine.scheduler.running),
                                       default=0))
    assert preempted >= 2  # someone was admitted a second time
    for k, prompt in enumerate(prompts):
        assert outs[k][-1].finish_reason == "length"
        assert ids(outs[k]) == ids(serve(make_engine("qwen3_next"), prompt, key=0, max_tokens=60))
    assert engine.prefix.num_requests == 0 and engine.runner.num_live_states == 0
    engine.prefix.tree.reset()
    assert engine.prefix.pool.num_free_pages == 24
