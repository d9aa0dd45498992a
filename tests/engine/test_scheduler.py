"""Scheduler: chunked prefill under the token budget, FIFO order, removal of any request."""

from __future__ import annotations

import pytest

from freetoken.engine.request import EngineRequest, RequestStatus
from freetoken.engine.scheduler import Scheduler, SchedulerConfig

from tests.engine.helpers import request


def _req(key: int, n_prompt: int) -> EngineRequest:
    return EngineRequest(key, request(list(range(1, n_prompt + 1)), rid=f"r{key}"), lambda _o: None)


def test_long_prompt_is_prefilled_in_budget_sized_chunks_then_decoded() -> None:
    s = Scheduler(SchedulerConfig(max_model_len=10_000, max_num_batched_tokens=2048))
    r = _req(0, 5000)
    s.add(r)
    grants = []
    for sampled in (None, None, 77, 78):
        b = s.schedule()
        grants.append((b.num_computed_tokens, len(b.token_ids), b.sample))
        s.update(b, sampled)
    assert grants == [(0, 2048, False), (2048, 2048, False), (4096, 904, True), (5000, 1, True)]
    b = s.schedule()
    assert b.token_ids == (78,) and b.num_computed_tokens == 5001
    assert r.output_ids == [77, 78] and r.status is RequestStatus.RUNNING


def test_first_chunk_holds_the_right_ids() -> None:
    s = Scheduler(SchedulerConfig(max_model_len=100, max_num_batched_tokens=3))
    s.add(_req(0, 7))
    b = s.schedule()
    assert b.token_ids == (1, 2, 3)
    s.update(b, None)
    assert s.schedule().token_ids == (4, 5, 6)


def test_requests_run_one_at_a_time_in_arrival_order() -> None:
    s = Scheduler(SchedulerConfig(max_model_len=100))
    a, b = _req(0, 3), _req(1, 3)
    s.add(a)
    s.add(b)
    assert s.schedule().request_key == 0
    assert s.schedule().request_key == 0  # still a's turn until it finishes
    assert s.finish(0) is a and a.status is RequestStatus.FINISHED
    assert s.schedule().request_key == 1
    assert s.finish(1) is b
    assert s.schedule() is None and not s.has_unfinished()


def test_finish_removes_a_waiting_request_and_unknown_is_none() -> None:
    s = Scheduler(SchedulerConfig(max_model_len=100))
    for k in range(3):
        s.add(_req(k, 2))
    assert s.finish(1).key == 1
    assert [r.key for r in s.waiting] == [0, 2]
    assert s.finish(99) is None


def test_update_for_a_request_that_is_not_running_raises() -> None:
    s = Scheduler(SchedulerConfig(max_model_len=100))
    s.add(_req(0, 2))
    b = s.schedule()
    s.finish(0)
    with pytest.raises(KeyError, match="request 0 is not running"):
        s.update(b, 5)


def test_config_rejects_bad_limits() -> None:
    with pytest.raises(ValueError, match="max_num_batched_tokens must be >= 1, got 0"):
        SchedulerConfig(max_model_len=10, max_num_batched_tokens=0)
    with pytest.raises(ValueError, match="max_model_len must be >= 2, got 1"):
        SchedulerConfig(max_model_len=1)
