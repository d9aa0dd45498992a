"""OpenAI ``logit_bias`` end to end on the real tiny qwen3_next engine (greedy decoding)."""

from __future__ import annotations

import httpx
import pytest
import torch

from freetoken.engine.async_engine import AsyncEngine
from freetoken.models.tiny import default_model_path
from freetoken.server import ServerConfig, create_app
from tests.server.srv_live import LiveServer

GREEDY = {"prompt": "def main():", "max_tokens": 4, "temperature": 0, "logprobs": 0}


@pytest.fixture(scope="module")
def tiny():
    engine = AsyncEngine.from_pretrained(default_model_path(), dtype=torch.float32,
                                         max_model_len=512)
    live = LiveServer(create_app(engine, ServerConfig(served_model_name="tiny")))
    http = httpx.Client(base_url=live.base_url, timeout=120)
    yield engine, http
    http.close()
    live.stop()
    engine.shutdown()


def _tokens(http: httpx.Client, **extra) -> list[str]:
    r = http.post("/v1/completions", json={**GREEDY, **extra})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["logprobs"]["tokens"]


def test_plus_100_forces_the_token_and_minus_100_bans_greedys_pick(tiny):
    engine, http = tiny
    forced = engine.tokenizer.encode(" zebra")[0]
    word = engine.tokenizer.decode([forced])
    assert _tokens(http, logit_bias={str(forced): 100}) == [word] * 4
    plain = _tokens(http)
    first = engine.tokenizer.encode(plain[0])
    assert len(first) == 1  # the token greedy picks first
    banned = _tokens(http, logit_bias={str(first[0]): -100})
    assert banned[0] != plain[0] and plain[0] not in banned


def test_chat_with_a_forcing_bias(tiny):
    engine, http = tiny
    forced = engine.tokenizer.encode("ok")[0]
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0,
            "logit_bias": {str(forced): 100}, "chat_template_kwargs": {"enable_thinking": False}}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == engine.tokenizer.decode([forced] * 3)
