"""/v1/completions and /v1/models through the official openai SDK."""

from __future__ import annotations

import openai
import pytest

from tests.server.conftest import MODEL
from tests.server.srv_live import json_events

TEXT = "def add(a, b):\n    return a + b\n"


@pytest.fixture
def client(srv):
    with openai.OpenAI(base_url=srv.base_url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_text_prompt(srv, client):
    srv.engine.push(TEXT)
    resp = client.completions.create(model="whatever", prompt="# add two numbers\n", max_tokens=4)
    ids = srv.engine.tokenizer.encode(TEXT)
    assert srv.engine.last.request.prompt_ids == tuple(
        srv.engine.tokenizer.encode("# add two numbers\n")
    )
    assert (
        resp.object == "text_completion"
        and resp.id.startswith("cmpl-")
        and resp.model == "whatever"
    )
    assert resp.choices[0].text == srv.engine.tokenizer.decode(ids[:4])
    assert resp.choices[0].finish_reason == "length"
    assert resp.choices[0].logprobs is None
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (
        len(srv.engine.last.request.prompt_ids),
        4,
    )


def test_token_id_prompt_runs_to_eos(srv, client):
    srv.engine.push(TEXT)
    resp = client.completions.create(model="m", prompt=[11, 22, 33])
    assert srv.engine.last.request.prompt_ids == (11, 22, 33)
    assert (resp.choices[0].text, resp.choices[0].finish_reason) == (TEXT, "stop")


def test_logprobs(srv, client):
    srv.engine.push("abc def")
    resp = client.completions.create(model="m", prompt="x", logprobs=2)
    tok = srv.engine.tokenizer
    ids = tok.encode("abc def")
    lp = resp.choices[0].logprobs
    assert srv.engine.last.request.sampling.logprobs == 2
    assert lp.tokens == [tok.decode([i]) for i in ids]
    assert lp.token_logprobs == [-0.5] * len(ids)
    assert lp.top_logprobs == [{tok.decode([i]): -0.5, tok.decode([i + 1]): -1.5} for i in ids]
    offsets = [0]
    for t in lp.tokens[:-1]:
        offsets.append(offsets[-1] + len(t))
    assert lp.text_offset == offsets


def test_stream_with_usage(srv):
    srv.engine.push("abc def", cached_tokens=1)
    body = {
        "prompt": "x",
        "stream": True,
        "stream_options": {"include_usage": True},
        "stop": " def",
    }
    with srv.http.stream("POST", "/v1/completions", json=body) as r:
        events = [d for _, d in json_events(r.iter_lines())]
    assert events[-1] == "[DONE]"
    usage = events[-2]
    assert usage["choices"] == [] and usage["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 1
    }
    chunks = events[:-2]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "abc"
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "stop"
    assert all(c["usage"] is None and c["object"] == "text_completion" for c in chunks)


def test_models_list_and_get(srv, client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve("other-name").id == "other-name"
