"""Turn construction without a server: plans from the synthetic trace set, harness edits,
max_tokens from recorded output, and the wire-format conversion."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from evals.replay.convert import (
    anthropic_to_canonical, canonical_to_anthropic, openai_to_canonical, tools_to_anthropic,
    tools_to_openai,
)
from evals.replay.synthetic import write_synthetic_traces
from evals.replay.traces import limit_calls
from evals.replay.turns import (
    RequestOptions, build_request, estimate_tokens, recorded_output_tokens,
)
from evals.replay.w4 import assemble_w4, needs, select_prompts
from evals.replay.workloads import build_plan

OPENAI = RequestOptions("openai", "m")
ANTHROPIC = RequestOptions("anthropic", "m")


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_traces(tmp_path_factory.mktemp("synthetic"))


def _lines(path: Path) -> list[dict]:
    return [json.loads(t) for t in path.read_text().splitlines()]


def test_synthetic_set_is_deterministic(tmp_path: Path, traces: Path) -> None:
    again = write_synthetic_traces(tmp_path / "again")
    files = sorted(p.relative_to(traces) for p in traces.rglob("*") if p.is_file())
    assert len(files) == 11
    assert all((again / f).read_bytes() == (traces / f).read_bytes() for f in files)


def test_swe_agent_elision_appears_exactly_from_call_6(traces: Path) -> None:
    calls = build_plan("W2", traces, select=("sweagent_synthetic_fix",))
    assert [c.harness for c in calls] == ["swe_agent"] * 10
    for k, call in enumerate(calls):
        sent = build_request(call, OPENAI).body["messages"]
        elided = [m["content"] for m in sent if str(m["content"]).startswith("Old environment")]
        # call k holds the instance prompt + k observations; all but the first and the last 5
        # are elided; observation j has 3 + j lines.
        assert elided == [f"Old environment output: ({3 + j} lines omitted)"
                          for j in range(max(0, k - 5))]
        req = build_request(call, OPENAI)
        assert req.edited == (k >= 6) and req.verbatim == (k < 6)
    unedited = build_request(calls[9], RequestOptions("openai", "m", edits=False)).body
    assert unedited["messages"] == calls[9].messages


def test_max_tokens_from_recorded_usage_or_estimate(traces: Path) -> None:
    w3 = build_plan("W3", traces)
    assert [build_request(c, ANTHROPIC).max_tokens for c in w3] == \
        [40, 90, 30, 30, 40, 40, 50, 50, 25]
    assert {build_request(c, ANTHROPIC).max_tokens_source for c in w3} == {"usage"}
    oc = build_plan("W2", traces, select=("opencode_",))
    # OpenCode usage: tokens.output + tokens.reasoning (20 + 7k + 3)
    assert [build_request(c, OPENAI).max_tokens for c in oc] == [23, 30, 23, 30, 37, 44]
    swe = build_plan("W2", traces, select=("sweagent_synthetic_fix",))
    text = swe[4].response["content"]
    assert build_request(swe[4], OPENAI).max_tokens == math.ceil(len(text) / 4)
    assert build_request(swe[4], OPENAI).max_tokens_source == "estimate"
    w1 = build_plan("W1", traces)
    req = build_request(w1[0], RequestOptions("openai", "m", default_max_tokens=77))
    assert (req.max_tokens, req.max_tokens_source) == (77, "default")


def test_recorded_output_tokens_shapes() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "read", "arguments": '{"a": 1}'}}
    assert recorded_output_tokens({"content": "x" * 9, "tool_calls": [call]}) == \
        (estimate_tokens("x" * 9 + "read" + '{"a": 1}'), "estimate")
    assert recorded_output_tokens({"content": "hi", "usage": {"completion_tokens": 47}}) == \
        (47, "usage")
    blocks = [{"type": "tool_use", "id": "t", "name": "exec", "input": {"command": "date"}}]
    assert recorded_output_tokens({"content": blocks, "usage": {"output_tokens": 0}}) == \
        (estimate_tokens('exec{"command": "date"}'), "estimate")
    assert recorded_output_tokens(None) is None


def test_ignore_eos_switch_and_stream_fields(traces: Path) -> None:
    call = build_plan("W2", traces, limit=1)[0]
    body = build_request(call, OPENAI).body
    assert body["stream"] is True and body["ignore_eos"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert "ignore_eos" not in build_request(call, RequestOptions("openai", "m",
                                                                   ignore_eos=False)).body


def _call(plan: list, key: str):
    return next(c for c in plan if c.key == key)


def test_anthropic_recording_sent_verbatim(traces: Path) -> None:
    call = _call(build_plan("W3", traces), "cc_synthetic__main#2")
    req = build_request(call, ANTHROPIC)
    assert req.verbatim and not req.edited
    assert req.body["messages"] == call.messages and "system" not in req.body
    assert req.path == "/v1/messages" and "stream_options" not in req.body


def test_anthropic_recording_as_openai(traces: Path) -> None:
    # main call 2 reads both sub-agents' results
    call = _call(build_plan("W3", traces), "cc_synthetic__main#2")
    msgs = build_request(call, OPENAI).body["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant", "tool", "tool"]
    assert msgs[3]["tool_calls"][1] == {"id": "toolu_syn_task_b", "type": "function", "function": {
        "name": "Task", "arguments": '{"description": "write tests", "prompt": "Write tests."}'}}
    assert msgs[5] == {"role": "tool", "tool_call_id": "toolu_syn_task_b",
                       "content": "Tests written in tests/."}
    assert msgs[3]["content"] == "Two independent parts: I start two agents."


def test_openai_recording_as_anthropic(traces: Path) -> None:
    call = build_plan("W2", traces, select=("sweagent_synthetic_fix",))[2]
    body = build_request(call, ANTHROPIC).body
    assert body["system"] == call.messages[0]["content"]
    assert [m["role"] for m in body["messages"]] == ["user", "assistant"] * 2 + ["user"]
    assert body["messages"][1]["content"] == [{"type": "text",
                                               "text": call.messages[2]["content"]}]
    oc = _call(build_plan("W2", traces), "opencode_synthetic__session1#2")
    msgs = build_request(oc, ANTHROPIC).body["messages"]
    assert msgs[1]["content"][0] == {"type": "tool_use", "id": "call_oc1_0", "name": "read",
                                     "input": {"filePath": "notes/n0.md"}}
    assert msgs[2]["content"][0] == {"type": "tool_result", "tool_use_id": "call_oc1_0",
                                     "content": "note 0: budget roadmap hiring"}


def test_conversion_round_trip_and_tools() -> None:
    anthropic = [
        {"role": "system", "content": [{"type": "text", "text": "sys", "cache_control": {}}]},
        {"role": "user", "content": [{"type": "text", "text": "a"}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "t"},
                                          {"type": "text", "text": "b"},
                                          {"type": "tool_use", "id": "u1", "name": "f",
                                           "input": {"x": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "u1",
                                      "content": [{"type": "text", "text": "r"}]},
                                     {"type": "text", "text": "more"}]},
    ]
    canonical = anthropic_to_canonical(anthropic)
    assert canonical[2] == {"role": "assistant", "content": "b", "reasoning_content": "t",
                            "tool_calls": [{"id": "u1", "type": "function",
                                            "function": {"name": "f", "arguments": '{"x": 1}'}}]}
    assert canonical[3:] == [{"role": "tool", "tool_call_id": "u1", "content": "r"},
                             {"role": "user", "content": [{"type": "text", "text": "more"}]}]
    system, back = canonical_to_anthropic(canonical)
    assert system == "sys"
    assert back[1]["content"] == [{"type": "thinking", "thinking": "t"},
                                  {"type": "text", "text": "b"},
                                  {"type": "tool_use", "id": "u1", "name": "f", "input": {"x": 1}}]
    assert back[2] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "u1", "content": "r"},
        {"type": "text", "text": "more"}]}
    gemini = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "g1", "type": "function", "function": {"name": "exec", "arguments": "{}"}}]},
        {"role": "tool", "name": "exec", "content": "out"}]
    assert openai_to_canonical(gemini)[1] == {"role": "tool", "tool_call_id": "g1",
                                              "content": "out"}
    tool = {"name": "f", "description": "d", "input_schema": {"type": "object"}}
    assert tools_to_anthropic(tools_to_openai([tool])) == [tool]
    with pytest.raises(ValueError, match=r"messages\[0\].role"):
        anthropic_to_canonical([{"role": "tool", "content": "x"}])


def test_w3_plan_dependencies(traces: Path) -> None:
    calls = build_plan("W3", traces)
    deps = {c.key: c.deps for c in calls}
    assert [c.key for c in calls] == [
        "cc_synthetic__main#0", "cc_synthetic__main#1", "cc_synthetic__subagent01#0",
        "cc_synthetic__subagent02#0", "cc_synthetic__subagent01#1", "cc_synthetic__subagent02#1",
        "cc_synthetic__subagent01#2", "cc_synthetic__subagent02#2", "cc_synthetic__main#2"]
    assert deps["cc_synthetic__subagent02#0"] == ("cc_synthetic__main#1",)
    assert deps["cc_synthetic__subagent02#1"] == ("cc_synthetic__subagent02#0",)
    assert deps["cc_synthetic__main#2"] == ("cc_synthetic__main#1", "cc_synthetic__subagent01#2",
                                            "cc_synthetic__subagent02#2")
    assert len(limit_calls(calls, 4)) == 4
    with pytest.raises(ValueError, match="--limit-turns must be >= 1"):
        limit_calls(calls, 0)


def test_w2_sessions_are_sequential_and_w1_independent(traces: Path) -> None:
    w2 = build_plan("W2", traces)
    starts = [c for c in w2 if c.turn == 0 and not c.thread.endswith("__session2")]
    assert starts[0].deps == ()
    assert set(starts[1].deps) == {c.key for c in w2 if c.session == starts[0].session}
    child = next(c for c in w2 if c.thread.endswith("__session2") and c.turn == 0)
    assert child.deps == ("opencode_synthetic__session1#1",)  # after the parent's `task` call
    assert all(c.deps == () for c in build_plan("W1", traces))


def test_w4_assembly(traces: Path) -> None:
    calls = assemble_w4(traces)
    prompts = json.loads((traces / "W4_fixtures/synthetic_user_prompts.json").read_text())
    chosen = select_prompts(prompts["prompts"])
    assert [p["task"] for p in chosen] == [
        "Cal0", "Mail0", "Cal1", "Mail1", "Cal2", "Mail2", "Cal3", "Mail3", "Cal4", "Mail4", "Cal5",
        "Mail5", "Cal6"]
    assert needs(chosen[1]["prompt"]) == ("inbox",)
    assert len(calls) == 13 + 2  # one read call for the calendar, one for the inbox
    capture = _lines(traces / "W4_openclaw_assistant/openclaw_openai.jsonl")[0]
    assert calls[-1].messages[0] == capture["messages"][0] and calls[0].tools == capture["tools"]
    users = [m["content"][0]["text"] for m in calls[-1].messages if m["role"] == "user"]
    assert users == [p["prompt"] for p in chosen]
    read = calls[0].response["tool_calls"][0]["function"]
    assert read == {"name": "read", "arguments": '{"path": "/home/user/workspace/calendar.json"}'}
    tool = calls[1].messages[3]
    fixture = json.loads((traces / "W4_fixtures/synthetic_mailbox_calendar.json").read_text())
    assert json.loads(tool["content"]) == fixture["calendar"]
    for prev, nxt in zip(calls, calls[1:]):  # the next call's history holds the composed reply
        assert prev.response in nxt.messages and nxt.deps == (prev.key,)
    answer = calls[4].response["content"][0]["text"]  # Cal1 (calls 0/2 read the files)
    assert answer.startswith("The answer is 2030-03-05T10:00.\n- Roadmap meeting: 2030-03-05T10")
