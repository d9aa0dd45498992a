"""Exact Anthropic SSE event sequences (raw stream parsed with httpx), keep-alive pings, and
in-band errors on both APIs' streams."""

from __future__ import annotations

import hashlib
import json
import re

from tests.server.srv_live import json_events, sse_events

BASH = {
    "name": "bash",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
}


def tool_call_text(name: str, args: dict) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


def stream_events(served, body: dict, path: str = "/v1/messages") -> list[tuple[str, dict]]:
    with served.http.stream(
        "POST", path, json={"model": "m", "max_tokens": 200, "stream": True, **body}
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = json_events(r.iter_lines())
    for name, data in events:
        assert data["type"] == name  # every event has a matching event: line and data.type
    return events


def test_thinking_text_tool_use_event_order(srv):
    srv.engine.push(
        "I should list.\n</think>\n\nListing." + tool_call_text("bash", {"command": "ls"})
    )
    events = stream_events(
        srv,
        {
            "messages": [{"role": "user", "content": "go"}],
            "tools": [BASH],
            "max_tokens": 2048,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
        },
        "/v1/messages?beta=true",
    )
    names = [n for n, _ in events]
    n_think = len(srv.engine.tokenizer.encode("I should list.\n"))  # upper bound of thinking deltas
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-2:] == ["message_delta", "message_stop"]
    blocks = [(d["index"], d["content_block"]) for n, d in events if n == "content_block_start"]
    assert [b["type"] for _, b in blocks] == ["thinking", "text", "tool_use"]
    assert [i for i, _ in blocks] == [0, 1, 2]
    assert blocks[0][1] == {"type": "thinking", "thinking": "", "signature": ""}
    assert blocks[1][1] == {"type": "text", "text": ""}
    assert re.match(r"^toolu_[A-Za-z0-9]{24}$", blocks[2][1]["id"])
    assert blocks[2][1]["name"] == "bash" and blocks[2][1]["input"] == {}

    # per block: start, deltas, stop, with nothing interleaved
    body = [(n, d) for n, d in events if n.startswith("content_block")]
    for index in range(3):
        mine = [(n, d) for n, d in body if d["index"] == index]
        assert mine[0][0] == "content_block_start" and mine[-1][0] == "content_block_stop"
        assert all(n == "content_block_delta" for n, _ in mine[1:-1])
        first = body.index(mine[0])
        assert body[first : first + len(mine)] == mine
    deltas = {
        i: [d["delta"] for n, d in body if n == "content_block_delta" and d["index"] == i]
        for i in range(3)
    }
    assert "".join(d["thinking"] for d in deltas[0][:-1]) == "I should list.\n"
    assert 1 <= len(deltas[0]) - 1 <= n_think
    assert deltas[0][-1] == {
        "type": "signature_delta",
        "signature": hashlib.sha256(b"I should list.\n").hexdigest(),
    }
    assert "".join(d["text"] for d in deltas[1]) == "\n\nListing."
    assert deltas[2] == [{"type": "input_json_delta", "partial_json": '{"command": "ls"}'}]

    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["role"] == "assistant"
    assert start["usage"] == {
        "input_tokens": len(srv.engine.last.request.prompt_ids),
        "output_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == srv.engine.last.tokens_sent
    assert events[-1][1] == {"type": "message_stop"}


def test_no_blank_text_block_before_tool_use(srv):
    srv.engine.push("\n\n" + tool_call_text("bash", {"command": "ls"}) + "\n")
    events = stream_events(srv, {"messages": [{"role": "user", "content": "go"}], "tools": [BASH]})
    assert [n for n, _ in events] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[2][1]["content_block"]["type"] == "tool_use"
    assert events[2][1]["index"] == 0


def test_stop_sequence_in_message_delta(srv):
    srv.engine.push("abc STOP def")
    events = stream_events(
        srv, {"messages": [{"role": "user", "content": "go"}], "stop_sequences": ["STOP"]}
    )
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert text == "abc "
    assert events[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "STOP"}


def test_message_start_usage_splits_cached_and_recomputed_prompt(srv):
    # the engine reports the reuse at admission: message_start already carries it
    srv.engine.push("ok", cached_tokens=3, start_delay_s=0.2)
    events = stream_events(srv, {"model": "m", "max_tokens": 5, "stream": True,
                                 "messages": [{"role": "user", "content": "x"}]})
    prompt = len(srv.engine.last.request.prompt_ids)
    assert srv.engine.last.request.report_admission
    split = {"input_tokens": prompt - 3, "cache_creation_input_tokens": 0,
             "cache_read_input_tokens": 3}
    assert events[0][1]["message"]["usage"] == {**split, "output_tokens": 0}
    assert events[-2][1]["usage"] == {**split, "output_tokens": srv.engine.last.tokens_sent}


def test_message_start_comes_before_any_ping_while_queued(make_server):
    # still queued after half a ping interval: message_start goes out with the whole prompt
    served = make_server(ping_interval_s=0.2)
    served.engine.push("ok", cached_tokens=3, queued_s=0.7)
    events = stream_events(served, {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})
    names = [n for n, _ in events]
    prompt = len(served.engine.last.request.prompt_ids)
    assert names[:2] == ["message_start", "ping"]
    assert names[: names.index("content_block_start")].count("ping") >= 3
    assert events[0][1]["message"]["usage"]["input_tokens"] == prompt
    assert events[-2][1]["usage"]["cache_read_input_tokens"] == 3


def test_pings_while_waiting_for_the_engine(make_server):
    served = make_server(ping_interval_s=0.2)
    served.engine.push("late", start_delay_s=1.0)
    with served.http.stream(
        "POST",
        "/v1/messages",
        json={
            "model": "m",
            "max_tokens": 5,
            "stream": True,
            "messages": [{"role": "user", "content": "x"}],
        },
    ) as r:
        events = sse_events(r.iter_lines())
    names = [n for n, _ in events]
    assert names[:2] == ["message_start", "ping"]
    waiting = names[: names.index("content_block_start")]
    assert waiting.count("ping") >= 4  # the one after message_start + ~every 0.2 s for 1 s
    assert all(d == '{"type":"ping"}' for n, d in events if n == "ping")


def test_openai_stream_keepalive_is_a_comment(make_server):
    served = make_server(ping_interval_s=0.2)
    served.engine.push("late", start_delay_s=0.7)
    body = {"messages": [{"role": "user", "content": "x"}], "stream": True}
    with served.http.stream("POST", "/v1/chat/completions", json=body) as r:
        events = sse_events(r.iter_lines())
    assert (":", "ping") in events
    assert events[-1] == (None, "[DONE]")


def test_engine_failure_mid_stream_is_an_error_event(srv):
    srv.engine.push("one two three four five", fail_after=3)
    events = stream_events(srv, {"messages": [{"role": "user", "content": "go"}]})
    assert events[-1] == (
        "error",
        {"type": "error", "error": {"type": "api_error", "message": "fake engine failure"}},
    )
    assert "message_stop" not in [n for n, _ in events]
    srv.assert_healthy()

    srv.engine.push("one two three four five", fail_after=3)
    with srv.http.stream(
        "POST",
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "go"}], "stream": True},
    ) as r:
        chat = [d for _, d in json_events(r.iter_lines())]
    assert chat[-1] == {
        "error": {
            "message": "fake engine failure",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }
    assert "[DONE]" not in chat
    srv.assert_healthy()
