"""A client that goes away stops generation: the server closes the engine iterator (abort)."""

from __future__ import annotations

import httpx
import pytest

USER = [{"role": "user", "content": "go"}]


@pytest.fixture
def served(make_server):
    return make_server(max_output_tokens=100_000)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": USER, "stream": True}),
        ("/v1/messages", {"messages": USER, "stream": True, "max_tokens": 100_000}),
        ("/v1/completions", {"prompt": "x", "stream": True}),
        ("/v1/responses", {"input": "go", "stream": True}),
    ],
    ids=["openai-chat", "anthropic", "openai-completions", "openai-responses"],
)
def test_stream_disconnect_aborts_generation(served, path, body):
    served.engine.push("tick ", endless=True, token_delay_s=0.02)
    with served.http.stream("POST", path, json=body) as r:
        lines = r.iter_lines()
        received = [next(lines) for _ in range(8)]
    assert any(line.startswith("data:") for line in received)
    log = served.engine.last
    assert log.ended.wait(5), "the engine iterator was not closed after the client left"
    assert log.outcome == "closed"
    sent = log.tokens_sent
    assert sent < 300  # at 20 ms/token, 5 s of runaway generation would be 250+ more
    served.assert_healthy()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": USER}),
        ("/v1/messages", {"messages": USER, "max_tokens": 100_000}),
        ("/v1/responses", {"input": "go"}),
    ],
    ids=["openai", "anthropic", "openai-responses"],
)
def test_non_streaming_disconnect_aborts_generation(served, path, body):
    served.engine.push("tick ", endless=True, token_delay_s=0.02)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(served.base_url + path, json=body, timeout=httpx.Timeout(10, read=0.5))
    log = served.engine.last
    assert log.ended.wait(5), "the engine iterator was not closed after the client left"
    assert log.outcome == "closed"
    served.assert_healthy()
    served.engine.push("after")
    r = served.http.post("/v1/chat/completions", json={"messages": USER})
    assert r.json()["choices"][0]["message"]["content"] == "after"


def test_disconnect_while_queued_aborts_the_waiting_request(make_server):
    # message_start went out before the admission (queued past half a ping interval)
    served = make_server(ping_interval_s=0.2)
    served.engine.push("tick ", endless=True, queued_s=3.0)
    body = {"messages": USER, "stream": True, "max_tokens": 100}
    with served.http.stream("POST", "/v1/messages", json=body) as r:
        lines = r.iter_lines()
        assert next(lines) == "event: message_start"
    log = served.engine.last
    assert log.ended.wait(2), "the engine iterator was not closed after the client left"
    assert (log.outcome, log.tokens_sent) == ("closed", 0)
    served.assert_healthy()
