"""The offload runtime inside the real engine: a live resize through ``run_between_steps`` while a
generation runs (the path of ``POST /v1/freetoken/memory``) keeps the greedy tokens identical to
the resident engine, and ``--record-routing`` writes every step's routing."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import torch

from freetoken.core import GenerationRequest, SamplingParams
from freetoken.engine.async_engine import AsyncEngine
from freetoken.offload.backend import MoeConfig

PROMPT = (5, 17, 300, 42, 8000, 12, 99, 1000, 7, 7, 2048, 31)
MAX_TOKENS = 48


def greedy_request() -> GenerationRequest:
    return GenerationRequest("r", PROMPT, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS,
                                                         ignore_eos=True))


async def generate(engine: AsyncEngine, during=None) -> tuple[list[int], list]:
    tokens, results = [], []
    async for out in engine.generate(greedy_request()):
        tokens.extend(out.token_ids)
        if during is not None and len(tokens) in during:
            results.append(await engine.run_between_steps(during[len(tokens)]))
    return tokens, results


def test_live_resize_through_the_engine_keeps_tokens(tiny_checkpoint, tmp_path):
    path = tiny_checkpoint("qwen3_next")
    resident = AsyncEngine.from_pretrained(path)
    try:
        expected, _ = asyncio.run(generate(resident))
    finally:
        resident.shutdown()
    record = tmp_path / "routing.npz"
    engine = AsyncEngine.from_pretrained(
        path, moe=MoeConfig(backend="hybrid", cache="6"), bandwidths=(4.0, 2.0),
        record_routing=record)
    try:
        moe = engine.moe
        slot = moe.stats().slot_bytes
        during = {8: lambda: moe.resize_now(2 * slot), 20: lambda: moe.resize_now(40 * slot),
                  30: lambda: moe.resize_now(1)}
        tokens, results = asyncio.run(generate(engine, during))
        assert tokens == expected
        assert [(r.old_slots, r.new_slots) for r in results] == [(6, 2), (2, 40), (40, 1)]
        stats = moe.stats()
        assert stats.num_slots == 1 and stats.backend == "hybrid"
        assert sum(l.steps for l in stats.layers) > 0
    finally:
        engine.shutdown()
    z = np.load(record)
    meta = json.loads(str(z["meta"]))
    ids = z["topk_ids"]
    # every prompt token and every fed-back sampled token; the last sampled token is fed once
    # more by the generation-end commit step, unless shutdown came first
    fed = ids.shape[0] - len(PROMPT)
    assert fed in (MAX_TOKENS - 1, MAX_TOKENS)
    assert ids.shape[1:] == (4, meta["top_k"])
    assert (ids >= 0).all() and (ids < meta["num_experts"]).all()
    assert z["token_phase"].tolist() == [0] * len(PROMPT) + [1] * fed
    assert torch.unique(torch.from_numpy(z["seq_id"])).numel() == 1
