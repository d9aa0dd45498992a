"""Scheduler without a prefix cache: continuous batching under the token budget, chunked prefill,
the running-request limit, removal of any request."""

from __future__ import annotations

import pytest

from freetoken.engine.batch import ForwardOutput
from freetoken.engine.request import EngineRequest, RequestStatus
from freetoken.engine.scheduler import Scheduler, SchedulerConfig

from tests.engine.helpers import request


def _req(key: int, n_prompt: int) -> EngineRequest:
    return EngineRequest(key, request(list(range(1, n_prompt + 1)), rid=f"r{key}"), lambda _o: None)


def _grants(batch) -> list[tuple[int, int, int, bool]]:
    return [(e.request_key, e.num_computed_tokens, len(e.token_ids), e.sample) for e in batch.entries]


def _apply(s: Scheduler, batch, tokens: dict[int, int | None]) -> None:
    for e in batch.entries:
        token = tokens.get(e.request_key) if e.sample else None
        s.update(e, ForwardOutput(e.request_key, token))


def test_long_prompt_is_prefilled_in_budget_sized_chunks_then_decoded() -> None:
    s = Scheduler(SchedulerConfig(max_model_len=10_000, max_num_batched_tokens=2048))
    r = _req(0, 5000)
    s.add(r)
    grants = []
    for sampled in (None, None, 77, 78):
        b = s.schedule()
        grants += _grants(b)
        _apply(s, b, {0: sampled})
    assert grants == [(0, 0, 2048, False), (0, 2048, 2048, False), (0, 4096, 904, True),
                      (0, 5000, 1, True)]
    b = s.schedule()
    assert b.entries[0].token_ids == (78,) and b.entries[0].num_computed_tokens == 5001
    assert r.output_ids == [77, 78] and r.status is RequestStatus.RUNNING


def test_first_entry_builds_the_state_and_later_ones_do_not() -> None:
    s = Scheduler(SchedulerConfig(max_model_len=100, max_num_batched_tokens=3))
    s.add(_req(0, 7))
    b = s.schedule()
    assert b.entries[0].token_ids == (1, 2, 3) and b.entries[0].new_state
    _apply(s, b, {})
    b = s.schedule()
    assert b.entries[0].token_ids == (4, 5, 6) and not b.entries[0].new_state


def test_requests_share_a_step_under_the_token_budget() -> None:
    s = Scheduler(SchedulerConfig(max_model_len=100, max_num_batched_tokens=12))
    s.add(_req(0, 10))
    s.add(_req(1, 10))
    b = s.schedule()
    assert _grants(b) == [(0, 0, 10, True), (1, 0, 2, False)]
    _apply(s, b, {0: 50})
    b = s.schedule()
    # decode of request 0 first, then the rest of request 1's prompt
    assert _grants(b) == [(0, 10, 1, True), (1, 2, 8, True)]
    _apply(s, b, {0: 51, 1: 60})
    b = s.schedule()
    assert _grants(b) == [(0, 11, 1, True), (1, 10, 1, True)]
    assert b.num_tokens == 2


def test_running_limit_keeps_the_third_request_waiting_until_one_finishes() -> None:
    s = Scheduler(SchedulerConfig(max_model_len=100, max_num_batched_tokens=64,
                                  max_running_requests=2))
    for k in range(3):
        s.add(_req(k, 3))
    b = s.schedule()
    assert [e.request_key for e in b.entries] == [0, 1]
    assert [r.key for r in s.waiting] == [2]
    _apply(s, b, {0: 9, 1: 9})
    assert s.finish(0, "stop").key == 0
    b = s.schedule()
    assert _grants(b) == [(1, 3, 1, True), (2, 0, 3, True)]


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
        s.update(b.entries[0], ForwardOutput(0, 5))
    assert s.schedule() is None and not s.has_unfinished()


def test_config_rejects_bad_limits() -> None:
    with pytest.raises(ValueError, match="max_num_batched_tokens must be >= 1, got 0"):
        SchedulerConfig(max_model_len=10, max_num_batched_tokens=0)
    with pytest.raises(ValueError, match="max_model_len must be >= 2, got 1"):
        SchedulerConfig(max_model_len=1)
    with pytest.raises(ValueError, match="max_running_requests must be >= 1, got 0"):
        SchedulerConfig(max_model_len=10, max_running_requests=0)


def test_decodes_go_first_and_a_long_prefill_leaves_room_for_a_newcomer() -> None:
    s = Scheduler(SchedulerConfig(max_model_len=100_000, max_num_batched_tokens=2048))
    s.add(_req(1, 60_000))
    s.add(_req(0, 3))  # queued behind the long one
    b = s.schedule()
    assert _grants(b) == [(1, 0, 2048, False)]
    _apply(s, b, {})
    b = s.schedule()  # the short one is admitted beside the long prefill
    assert _grants(b) == [(1, 2048, 1536, False), (0, 0, 3, True)]
    _apply(s, b, {0: 7})
    s.add(_req(2, 14))
    b = s.schedule()
    # request 0's decode first, then the long prefill less the admission reserve (a quarter of
    # the 2047 tokens left: 511), then the newcomer
    assert _grants(b) == [(0, 3, 1, True), (1, 3584, 1536, False), (2, 0, 14, True)]
