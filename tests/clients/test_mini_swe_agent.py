"""mini-swe-agent (litellm ``openai/<model>``, non-streaming Chat Completions) against the live server.

mini-swe-agent needs a tool call in every reply; the random tiny model returns text, so each step
ends in mini's own "No tool calls found" format-error feedback and the run stops at
``agent.step_limit`` with ``exit_status: LimitsExceeded`` and exit code 0. What is asserted, and why
it is not vacuous: exactly ``step_limit`` model calls reached the server and were answered 200 with
sound ``chat.completion`` objects; the trajectory holds, step by step, the very responses the server
sent (same ids, parsed by litellm), each classified by mini as a format error exactly when the
server sent no ``tool_calls``; no API/transport error appears anywhere.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from . import agents
from .runner import assert_clean_run, response_id, run_client

pytestmark = pytest.mark.clients

STEP_LIMIT = 2


def test_mini_swe_agent_litellm(live, mini_swe_agent_client, tmp_path: Path) -> None:  # noqa: ANN001
    work = tmp_path / "work"
    work.mkdir()
    trajectory = tmp_path / "traj.json"
    argv, env = agents.mini_swe_agent(mini_swe_agent_client, live.base_url, live.model, tmp_path / "home",
                                      trajectory, STEP_LIMIT)
    run = run_client("mini-swe-agent (litellm)", argv, env, work, live.server, live.tap, live.artifacts,
                     timeout=300)
    assert_clean_run(run, live.tap, paths={"/v1/chat/completions"}, model=live.model, min_calls=STEP_LIMIT)

    calls = run.model_calls()
    assert len(calls) == STEP_LIMIT, f"{len(calls)} calls for step_limit {STEP_LIMIT}"
    for ex in calls:
        body = ex.request_json()
        assert not body.get("stream"), "mini-swe-agent is expected to call without streaming"
        assert [t["function"]["name"] for t in body["tools"]] == ["bash"]

    info = json.loads(trajectory.read_text())
    messages = info["messages"]
    stats = info["info"]["model_stats"]
    assert stats["api_calls"] == STEP_LIMIT, stats
    steps = [m for m in messages if isinstance(m.get("extra"), dict) and "response" in m["extra"]]
    assert [m["extra"]["response"]["id"] for m in steps] == [response_id(ex) for ex in calls]
    server_tool_calls = [bool(json.loads(ex.response_text())["choices"][0]["message"].get("tool_calls"))
                         for ex in calls]
    format_errors = [m["extra"].get("interrupt_type") == "FormatError" for m in steps]
    assert format_errors == [not has_calls for has_calls in server_tool_calls], (format_errors, server_tool_calls)
    exit_status = info["info"]["exit_status"]
    if not any(server_tool_calls):
        assert exit_status == "LimitsExceeded", info["info"]
    else:
        assert exit_status in ("LimitsExceeded", "Submitted"), info["info"]
