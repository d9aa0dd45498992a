"""The ring of recently finished requests behind ``GET /v1/freetoken/status``: TTFT and decode
speed from the request's own timestamps, and the bound on what is kept."""

from __future__ import annotations

import pytest

from freetoken.core import GenerationRequest, SamplingParams
from freetoken.engine.recent import RecentRequests
from freetoken.engine.request import EngineRequest


def _finished(rid: str, outputs: int, first: float | None) -> EngineRequest:
    req = EngineRequest(0, GenerationRequest(rid, (1, 2, 3), SamplingParams()), lambda _o: None,
                        arrival_time=10.0)
    req.output_ids = list(range(outputs))
    req.first_token_time = first
    req.finish_time = 12.5
    req.num_cached_tokens = 2
    return req


def test_timing_from_the_request_timestamps() -> None:
    ring = RecentRequests()
    ring.add(_finished("a", 6, first=10.5), "stop")
    ring.add(_finished("b", 1, first=10.25), "length")
    ring.add(_finished("c", 0, first=None), "abort")
    a, b, c = ring.snapshot()
    assert (a.seq, a.request_id, a.finish_reason) == (1, "a", "stop")
    assert (a.prompt_tokens, a.cached_tokens, a.output_tokens) == (3, 2, 6)
    assert a.ttft_s == pytest.approx(0.5) and a.decode_tok_s == pytest.approx(5 / 2.0)
    assert b.ttft_s == pytest.approx(0.25) and b.decode_tok_s is None  # one token: no decode
    assert (c.seq, c.ttft_s, c.decode_tok_s) == (3, None, None)


def test_keeps_the_last_maxlen_in_order() -> None:
    ring = RecentRequests(maxlen=3)
    for i in range(5):
        ring.add(_finished(f"r{i}", 2, first=11.0), "stop")
    assert [(t.seq, t.request_id) for t in ring.snapshot()] == [(3, "r2"), (4, "r3"), (5, "r4")]
