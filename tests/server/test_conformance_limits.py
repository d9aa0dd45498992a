"""Conformance on the real tiny qwen3_next engine (its own chat template, the real parser):
context-length errors on every endpoint, malformed bodies, health afterwards, and multi-token
stop strings that never leak their first tokens into a stream."""

from __future__ import annotations

import httpx
import pytest
import torch

from freetoken.engine.async_engine import AsyncEngine
from freetoken.models.tiny import default_model_path
from freetoken.server import ServerConfig, create_app
from tests.server.srv_conformance import fold_anthropic_stream, fold_openai_stream
from tests.server.srv_live import LiveServer, json_events

MAX_LEN = 64
LONG = [{"role": "user", "content": "word " * 80}]
OFF = {"enable_thinking": False}
# Seeded sampling is reproducible (and independent of the prefix cache), so a second request
# with a stop string sees the same tokens up to the stop.
SEEDED = {"temperature": 1.0, "seed": 1, "ignore_eos": True, "max_tokens": 16}


class Tiny:
    def __init__(self) -> None:
        self.engine = AsyncEngine.from_pretrained(
            default_model_path(), dtype=torch.float32, device="cpu", max_model_len=MAX_LEN
        )
        config = ServerConfig(served_model_name="tiny", max_output_tokens=32)
        self.live = LiveServer(create_app(self.engine, config))
        self.http = httpx.Client(base_url=self.live.base_url, timeout=60)

    def stream(self, path: str, body: dict) -> list:
        with self.http.stream("POST", path, json={**body, "stream": True}) as r:
            assert r.status_code == 200
            return json_events(r.iter_lines())

    def close(self) -> None:
        self.http.close()
        self.live.stop()
        self.engine.shutdown()


@pytest.fixture(scope="module")
def tiny():
    server = Tiny()
    yield server
    server.close()


def _assert_healthy(tiny: Tiny) -> None:
    r = tiny.http.get("/health")
    assert (r.status_code, r.json()) == (200, {"status": "ok"})
    r = tiny.http.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "chat_template_kwargs": OFF,
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize("stream", [False, True])
def test_prompt_longer_than_the_context_is_a_400_on_every_endpoint(tiny, stream):
    counted = tiny.http.post(
        "/v1/messages/count_tokens?beta=true", json={"model": "m", "messages": LONG}
    )
    assert counted.status_code == 200
    n_ant = counted.json()["input_tokens"]
    assert n_ant > MAX_LEN

    body = {"model": "m", "max_tokens": 8, "messages": LONG, "stream": stream}
    r = tiny.http.post("/v1/messages?beta=true", json=body)
    assert (r.status_code, r.json()) == (
        400,
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": f"prompt is too long: {n_ant} tokens > {MAX_LEN - 1} maximum",
            },
        },
    )

    r = tiny.http.post("/v1/chat/completions", json={"messages": LONG, "stream": stream})
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "context_length_exceeded",
        "messages",
    )
    assert error["message"].startswith(f"This model's maximum context length is {MAX_LEN} tokens.")

    r = tiny.http.post("/v1/responses", json={"input": LONG, "stream": stream})
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "context_length_exceeded",
        "input",
    )
    assert error["message"].endswith("Please reduce the length of the input.")

    too_long = list(range(1, MAX_LEN + 1))
    r = tiny.http.post("/v1/completions", json={"prompt": too_long, "stream": stream})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    _assert_healthy(tiny)


def test_a_prompt_that_leaves_one_token_runs(tiny):
    r = tiny.http.post(
        "/v1/completions",
        json={"prompt": list(range(1, MAX_LEN)), "max_tokens": 10, "ignore_eos": True},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 1


@pytest.mark.parametrize(
    "path",
    ["/v1/chat/completions", "/v1/messages?beta=true", "/v1/messages/count_tokens?beta=true",
     "/v1/responses"],
)
@pytest.mark.parametrize("raw", [b'{"messages": [', b"[]", b'{"messages": "hi"}'])
def test_malformed_body_is_a_400_and_the_server_stays_healthy(tiny, path, raw):
    r = tiny.http.post(path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    body = r.json()
    if path.startswith("/v1/messages"):
        assert (body["type"], body["error"]["type"]) == ("error", "invalid_request_error")
    else:
        assert body["error"]["type"] == "invalid_request_error"
    _assert_healthy(tiny)


def _stop_inside(tiny: Tiny, text: str) -> tuple[str, str]:
    """``(before, stop)``: a stop string of 3 tokens taken from the middle of ``text``, and the
    text before its first occurrence."""
    tok = tiny.engine.tokenizer
    ids = tok.encode(text)
    assert len(ids) >= 8, text
    before, stop = tok.decode(ids[:4]), tok.decode(ids[4:7])
    assert text.startswith(before + stop) and text.find(stop) == len(before)
    assert len(tok.encode(stop)) >= 2
    return before, stop


def test_multi_token_stop_string_never_leaks_into_an_openai_stream(tiny):
    body = {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": OFF, **SEEDED}
    r = tiny.http.post("/v1/chat/completions", json=body)
    full = r.json()["choices"][0]["message"]["content"]
    before, stop = _stop_inside(tiny, full)

    events = tiny.stream("/v1/chat/completions", {**body, "stop": [stop]})
    message, finish = fold_openai_stream(events)
    assert (message["content"], finish) == (before, "stop")
    r = tiny.http.post("/v1/chat/completions", json={**body, "stop": [stop]})
    assert r.json()["choices"][0]["message"]["content"] == before


def test_multi_token_stop_sequence_never_leaks_into_an_anthropic_stream(tiny):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **SEEDED}
    r = tiny.http.post("/v1/messages", json=body)
    (block,) = r.json()["content"]
    before, stop = _stop_inside(tiny, block["text"])

    message = fold_anthropic_stream(tiny.stream("/v1/messages", {**body, "stop_sequences": [stop]}))
    assert message["content"] == [{"type": "text", "text": before}]
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", stop)


def test_a_kv_pool_smaller_than_the_context_sets_the_limit():
    """``--kv-cache-bytes`` below one full-length sequence: the pool less two pages (what a lone
    request reusing a prefix that ends mid-page needs at most) becomes the advertised context, so
    an over-long prompt is the usual 400, never a 500 or a request that cannot finish."""
    from freetoken.prefix.build import CacheConfig

    engine = AsyncEngine.from_pretrained(default_model_path(), dtype=torch.float32, device="cpu",
                                         max_model_len=128, cache=CacheConfig(kv_cache_bytes=96 * 1024))
    try:
        limit = engine.info.max_model_len
        pool = engine._engine.prefix.pool
        assert limit < 128 and limit == pool.num_slots - 2 * pool.page_size
        live = LiveServer(create_app(engine, ServerConfig(served_model_name="tiny", max_output_tokens=64)))
        try:
            with httpx.Client(base_url=live.base_url, timeout=60) as http:
                body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "word " * 60}]}
                n = http.post("/v1/messages/count_tokens", json=body).json()["input_tokens"]
                assert limit <= n < 128
                r = http.post("/v1/messages", json=body)
                assert (r.status_code, r.json()["error"]["message"]) == (
                    400, f"prompt is too long: {n} tokens > {limit - 1} maximum")
                r = http.post("/v1/chat/completions", json=body)
                assert (r.status_code, r.json()["error"]["code"]) == (400, "context_length_exceeded")
                assert http.get("/v1/models").json()["data"][0]["max_model_len"] == limit
                # the same long request twice: the second reuses the cached prefix, which ends
                # inside a page; both must run to the context limit (this hung when the pool itself
                # was advertised as the context)
                for _ in range(2):
                    r = http.post("/v1/completions", json={
                        "prompt": list(range(1, limit - 20)), "max_tokens": 100, "ignore_eos": True})
                    assert r.status_code == 200, r.text
                    assert (r.json()["choices"][0]["finish_reason"], r.json()["usage"]["completion_tokens"]) == (
                        "length", 21)
                ok = http.post("/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                    "chat_template_kwargs": OFF})
                assert ok.status_code == 200, ok.text
        finally:
            live.stop()
    finally:
        engine.shutdown()
