"""The Codex CLI adapter: detection from each of its signals, version and session key, and
its compaction simulator (X1)."""

from __future__ import annotations

import pytest

from harness_adapters import RequestInfo, detect_adapter, detection_scores, get_adapter
from harness_adapters.codex import compact, estimate_tokens, initial_context_end
from tests.harness_adapters import client_requests as req

CODEX = get_adapter("codex")
DEV = {"role": "system", "content": req.CODEX_BASE_PROMPT}
ENV = {"role": "user", "content": "<environment_context>\n  <cwd>/w</cwd>\n</environment_context>"}


def _info(headers: dict, body: dict | None = None) -> RequestInfo:
    return RequestInfo("openai", "/v1/responses", headers, body or {})


def test_codex_request_is_detected_with_its_scores() -> None:
    scores = detection_scores(req.codex())
    assert scores["codex"] == 0.97
    assert {k: v for k, v in scores.items() if k != "codex"} == {
        "claude_code": 0.0, "opencode": 0.0, "openclaw": 0.0, "swe_agent": 0.0,
        "mini_swe_agent": 0.0, "generic": 0.0}
    assert detect_adapter(req.codex(headers=False)).name == "codex"


@pytest.mark.parametrize("headers, body, score", [
    ({"originator": "codex_cli_rs"}, {}, 0.97),
    ({"Originator": "codex_vscode"}, {}, 0.97),
    ({"user-agent": "codex_cli_rs/0.171.0 (Mac OS 15.1; arm64) iTerm.app"}, {}, 0.95),
    ({"x-codex-window-id": "t:0"}, {}, 0.9),
    ({"x-codex-turn-metadata": "{}"}, {}, 0.9),
    ({}, {"instructions": "You are a coding agent running in the Codex CLI."}, 0.6),
    ({}, req.codex(headers=False).body, 0.6),
    ({}, {**req.codex(headers=False, base_prompt=False).body}, 0.5),
    ({"originator": "opencode", "user-agent": "mycodex_tool/1.0"}, {}, 0.0),
    ({}, {"input": "You are a coding agent running in the Codex CLI."}, 0.0),
])
def test_each_signal_has_its_confidence(headers: dict, body: dict, score: float) -> None:
    assert CODEX.detect(_info(headers, body)) == score


@pytest.mark.parametrize("body", [
    {"input": [None, 3, {"role": "developer", "content": 5}]}, {"tools": "x"},
    {"tools": [1, {"type": "function", "name": 3}]}, {"instructions": 7, "input": {}},
    {"prompt_cache_key": 12},
])
def test_odd_bodies_never_raise(body: dict) -> None:
    info = _info({}, body)
    assert CODEX.detect(info) == 0.0
    assert CODEX.version(info) is None and CODEX.session_key(info) is None


def test_version_and_session_key() -> None:
    assert CODEX.version(req.codex()) == (0, 171, 0)
    assert CODEX.version(req.codex(headers=False)) is None
    assert CODEX.session_key(req.codex()) == req.CODEX_THREAD
    assert CODEX.session_key(_info({"thread-id": "t-1"})) == "t-1"
    assert CODEX.session_key(req.codex(headers=False)) == req.CODEX_THREAD  # prompt_cache_key
    assert CODEX.session_key(_info({}, {"prompt_cache_key": " "})) is None


def test_alias_and_forced_header() -> None:
    assert get_adapter("Codex-CLI") is CODEX
    forced = _info({"X-FreeToken-Harness": "codex"}, req.opencode().body)
    assert detect_adapter(forced) is CODEX


def test_initial_context_is_developer_and_context_messages() -> None:
    msgs = [DEV, {"role": "system", "content": "<permissions>"}, ENV,
            {"role": "user", "content": "hi"}]
    assert initial_context_end(msgs) == 3
    assert initial_context_end([{"role": "user", "content": "hi"}]) == 0


def test_compaction_keeps_context_recent_user_messages_and_the_summary() -> None:
    turns = []
    for k in range(3):
        turns += [{"role": "user", "content": f"task {k}"},
                  {"role": "assistant", "content": f"done {k}"}]
    msgs = [DEV, ENV, *turns, {"role": "user", "content": "<turn_aborted>"}]
    out = CODEX.simulate_edits(msgs, summary="SUMMARY\nall three tasks done")
    assert out == [DEV, ENV, {"role": "user", "content": "task 0"},
                   {"role": "user", "content": "task 1"}, {"role": "user", "content": "task 2"},
                   {"role": "user", "content": "SUMMARY\nall three tasks done"}]
    assert out[0] is DEV and msgs[2] == {"role": "user", "content": "task 0"}


def test_compaction_budget_truncates_the_oldest_kept_message_and_drops_earlier_ones() -> None:
    old = "a" * 400  # 100 estimated tokens
    msgs = [DEV, {"role": "user", "content": "first"}, {"role": "user", "content": old},
            {"role": "user", "content": "b" * 40}]  # 10 tokens
    out = compact(msgs, "S", user_tokens=14)
    cut = "a" * 8 + "…96 tokens truncated…" + "a" * 8
    assert out == [DEV, {"role": "user", "content": cut},
                   {"role": "user", "content": "b" * 40}, {"role": "user", "content": "S"}]
    assert compact(msgs, "S", user_tokens=0) == [DEV, {"role": "user", "content": "S"}]


def test_earlier_summaries_are_not_kept_as_user_messages() -> None:
    msgs = [DEV, {"role": "user", "content": "PREFIX\nold summary"},
            {"role": "user", "content": "next task"}]
    assert compact(msgs, "PREFIX\nnew", summary_prefix="PREFIX\n") == [
        DEV, {"role": "user", "content": "next task"}, {"role": "user", "content": "PREFIX\nnew"}]


def test_estimate_and_bad_options() -> None:
    assert [estimate_tokens(s) for s in ("", "abc", "abcd", "abcde", "é" * 3)] == [0, 1, 1, 2, 2]
    msgs = [DEV]
    assert CODEX.simulate_edits(msgs) == msgs and CODEX.simulate_edits(msgs) is not msgs
    with pytest.raises(ValueError, match="summary must not be empty"):
        CODEX.simulate_edits(msgs, summary="")
    with pytest.raises(ValueError, match="user_tokens must be >= 0, got -1"):
        CODEX.simulate_edits(msgs, summary="s", user_tokens=-1)
    with pytest.raises(TypeError, match="compact needs a summary string, got None"):
        compact(msgs, None)
