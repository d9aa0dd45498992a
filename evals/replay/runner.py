"""Runs the turns of a plan against an endpoint: dependency-ordered, up to ``concurrency`` at a
time, one record per turn.

Scheduling: whenever a slot is free, the earliest call (in plan order) whose dependencies have
all finished starts. With concurrency 1 that is exactly the recorded order; with more, W3's
sub-agent threads run side by side as they did when recorded, while every thread stays in order
(a call starts only after the previous call of its thread finished). A failed turn counts as
finished: the next turn's history is the recorded one either way.

Per-turn engine statistics (FreeToken only) are ``/metrics`` deltas between a scrape just before
the request and one just after it; with concurrent turns they include whatever else ran in that
window, so the run-level totals (first scrape to last) are the numbers to compare.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from evals.replay.client import StreamResult, headers, stream_turn
from evals.replay.scrape import scrape, stats_delta
from evals.replay.turns import TurnRequest, body_json
from freetoken.agents.discover import is_loopback


@dataclass(frozen=True)
class RunConfig:
    """Endpoint settings of a run.

    Attributes:
        endpoint: base URL without the ``/v1/...`` path (``http://127.0.0.1:8300``).
        protocol: ``"openai"`` or ``"anthropic"``.
        api_key: sent as Bearer and ``x-api-key`` when set.
        concurrency: most turns in flight at once (0: no limit besides the dependencies).
        timeout_s: per-request timeout (s): the whole request, sent -> stream end, wall clock
            (``--timeout``); a turn that runs longer is recorded as failed.
        extra_headers: added to every request.
        scrape_metrics: scrape ``/metrics`` around every turn when the endpoint is FreeToken.
        harness_header: send ``X-FreeToken-Harness: <the call's adapter>`` (FreeToken's header
            that names the harness outright instead of detecting it).
    """

    endpoint: str
    protocol: str
    api_key: str | None = None
    concurrency: int = 1
    timeout_s: float = 600.0
    extra_headers: tuple[tuple[str, str], ...] = ()
    scrape_metrics: bool = True
    harness_header: bool = False


def turn_record(index: int, req: TurnRequest, res: StreamResult, start_s: float, end_s: float,
                engine: dict | None) -> dict:
    """One line of turns.jsonl (fields documented in evals/README.md)."""
    call = req.call
    return {
        "index": index, "key": call.key, "session": call.session, "thread": call.thread,
        "turn": call.turn, "harness": call.harness, "recorded_protocol": call.protocol,
        "messages": len(req.body["messages"]), "edited": req.edited, "verbatim": req.verbatim,
        "max_tokens": req.max_tokens, "max_tokens_source": req.max_tokens_source,
        "status": res.status, "error": res.error, "prompt_tokens": res.prompt_tokens,
        "reused_tokens": res.reused_tokens, "output_tokens": res.output_tokens,
        "output_tokens_source": res.output_tokens_source, "ttft_s": res.ttft_s,
        "decode_s": res.decode_s, "decode_tps": res.decode_tps, "total_s": res.total_s,
        "start_s": start_s, "end_s": end_s, "finish_reason": res.finish_reason,
        "engine": engine,
    }


async def replay(requests: list[TurnRequest], cfg: RunConfig,
                 on_done: Callable[[dict], None] | None = None,
                 on_start: Callable[[dict | None], None] | None = None
                 ) -> tuple[list[dict], dict | None]:
    """Send every request (module docstring) and return ``(records in plan order, engine
    totals)``; engine totals are the ``/metrics`` deltas over the whole run (None when the
    endpoint is not FreeToken or scraping is off). ``on_done`` gets each record as its turn
    finishes (completion order), so a caller keeps the finished turns when the run is cancelled
    (Ctrl-C under ``asyncio.run`` cancels this coroutine). ``on_start`` gets the first ``/metrics``
    scrape (``scrape.engine_stats``, raw values; None for other endpoints or with scraping off)
    before the first request is sent (:mod:`evals.replay.warm` reads it).

    Raises:
        ValueError: negative concurrency, or a dependency on a call that is not in ``requests``.
    """
    if cfg.concurrency < 0:
        raise ValueError(f"concurrency must be >= 0, got {cfg.concurrency}")
    keys = {r.call.key for r in requests}
    for r in requests:
        unknown = [d for d in r.call.deps if d not in keys]
        if unknown:
            raise ValueError(f"{r.call.key} depends on {unknown}, which are not in the run")
    base = cfg.endpoint.rstrip("/")
    hdrs = headers(cfg.protocol, cfg.api_key, dict(cfg.extra_headers))
    timeout = httpx.Timeout(cfg.timeout_s)
    limits = httpx.Limits(max_connections=max(cfg.concurrency, len(requests), 1))
    records: dict[int, dict] = {}
    async with httpx.AsyncClient(timeout=timeout, limits=limits,
                                 trust_env=not is_loopback(base)) as client:
        first = await scrape(client, base, hdrs) if cfg.scrape_metrics else None
        freetoken = first is not None
        if on_start is not None:
            on_start(first)
        t_run = time.perf_counter()

        async def run_one(i: int, req: TurnRequest) -> None:
            before = await scrape(client, base, hdrs) if freetoken else None
            start = time.perf_counter() - t_run
            call_hdrs = {**hdrs, "x-freetoken-harness": req.call.harness} \
                if cfg.harness_header else hdrs
            res = await stream_turn(client, base + req.path, body_json(req), cfg.protocol,
                                    call_hdrs, cfg.timeout_s)
            end = time.perf_counter() - t_run
            after = await scrape(client, base, hdrs) if freetoken else None
            records[i] = turn_record(i, req, res, start, end, stats_delta(before, after))
            if on_done is not None:
                on_done(records[i])

        pending = list(enumerate(requests))
        done: set[str] = set()
        running: dict[asyncio.Task, str] = {}
        while pending or running:
            while pending and (cfg.concurrency == 0 or len(running) < cfg.concurrency):
                ready = next((p for p in pending if all(d in done for d in p[1].call.deps)), None)
                if ready is None:
                    break
                pending.remove(ready)
                running[asyncio.create_task(run_one(*ready))] = ready[1].call.key
            if not running:
                raise ValueError(f"dependency cycle among {[p[1].call.key for p in pending]}")
            finished, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in finished:
                task.result()
                done.add(running.pop(task))
        last = await scrape(client, base, hdrs) if freetoken else None
    return [records[i] for i in range(len(requests))], stats_delta(first, last)
