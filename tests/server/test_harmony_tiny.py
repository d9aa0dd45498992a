"""End-to-end: gpt-oss (harmony) on the real tiny gpt_oss engine through a live server.

What it checks on the random-weight model:
* the generated checkpoint carries templates/gpt_oss.jinja, stops on <|return|> and <|call|>,
  and keeps the harmony tokens in generated text (not in ``special_ids``);
* the prompt the engine prefills is the template's text, each harmony token one id;
* forced calls (OpenAI ``required`` / named, Anthropic ``any`` / ``tool``) with thinking off go
  through the harmony grammar and come back as valid calls, streamed and not
  (``tool_calls`` / ``tool_use``); cut by ``max_tokens`` they are ``length`` / ``max_tokens``;
* with thinking on the grammar lets an analysis message come first (reasoning, or an honest
  length cut);
* unforced answers of the random model are 200s whose content and reasoning carry no harmony
  token, both APIs, streamed and not.
"""

from __future__ import annotations

import json

import httpx
import pytest
import torch

from freetoken.chat.template import ChatTemplate
from freetoken.engine.async_engine import AsyncEngine
from freetoken.models.tiny import cached_tiny
from freetoken.server import ServerConfig, create_app
from freetoken.tokenizer.tokenizer import Tokenizer
from tests.engine.constrained_schemas import TOOLS, check_call
from tests.server.srv_live import LiveServer, json_events

USER = [{"role": "user", "content": "What is the weather in Oslo?"}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
ANT_TOOLS = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
             for t in TOOLS]
FORMAT_TOKENS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>",
                 "<|call|>", "<|return|>", "<|endoftext|>")


@pytest.fixture(scope="module")
def checkpoint():
    return cached_tiny("gpt_oss")


@pytest.fixture(scope="module")
def tiny(checkpoint):
    engine = AsyncEngine.from_pretrained(checkpoint, dtype=torch.float32, max_model_len=4096)
    live = LiveServer(create_app(engine, ServerConfig(served_model_name="tiny",
                                                      max_output_tokens=256)))
    http = httpx.Client(base_url=live.base_url, timeout=120)
    yield engine, http
    http.close()
    live.stop()
    engine.shutdown()


def _chat(http, stream=False, **body):
    body = {"messages": USER, "tools": TOOLS, **body}
    if not stream:
        r = http.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        return choice["message"], choice["finish_reason"]
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        events = json_events(r.iter_lines())
    assert events[-1] == (None, "[DONE]")
    message, calls, finish = {"content": "", "reasoning_content": ""}, {}, None
    for _, data in events[:-1]:
        for choice in data["choices"]:
            delta = choice["delta"]
            for key in ("content", "reasoning_content"):
                message[key] += delta.get(key) or ""
            for call in delta.get("tool_calls") or []:
                slot = calls.setdefault(call["index"], {"name": "", "arguments": ""})
                slot["name"] += (call.get("function") or {}).get("name") or ""
                slot["arguments"] += (call.get("function") or {}).get("arguments") or ""
            finish = choice["finish_reason"] or finish
    if calls:
        message["tool_calls"] = [{"function": calls[i]} for i in sorted(calls)]
    return message, finish


def _messages(http, stream=False, **body):
    body = {"max_tokens": 128, "messages": USER, "tools": ANT_TOOLS, **body}
    if not stream:
        r = http.post("/v1/messages", json=body)
        assert r.status_code == 200, r.text
        return r.json()["content"], r.json()["stop_reason"]
    with http.stream("POST", "/v1/messages", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        events = json_events(r.iter_lines())
    blocks, partial = [], {}
    for name, data in events:
        if name == "content_block_start":
            blocks.append(dict(data["content_block"]))
        elif name == "content_block_delta":
            delta, block = data["delta"], blocks[data["index"]]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "input_json_delta":
                partial[data["index"]] = partial.get(data["index"], "") + delta["partial_json"]
    for index, text in partial.items():
        blocks[index]["input"] = json.loads(text)
    (stop,) = [d["delta"]["stop_reason"] for n, d in events if n == "message_delta"]
    return blocks, stop


def test_checkpoint_carries_the_harmony_template_and_stop_tokens(checkpoint):
    tok = Tokenizer.from_pretrained(checkpoint)
    ours = ChatTemplate.for_model(None, "gpt_oss").source
    assert tok.chat_template == ours
    for stop in ("<|return|>", "<|call|>"):
        assert tok.token_to_id(stop) in tok.eos_token_ids
    for token in ("<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|constrain|>"):
        assert tok.token_to_id(token) not in tok.special_ids


def test_the_engine_prefills_the_template_text(tiny):
    engine, http = tiny
    r = http.post("/v1/messages/count_tokens", json={"messages": USER, "tools": ANT_TOOLS})
    assert r.status_code == 200, r.text
    template = ChatTemplate.for_model(engine.tokenizer.chat_template, "gpt_oss")
    tools = [{"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]}}
             for t in ANT_TOOLS]  # the form the Anthropic route renders (no descriptions)
    text = template.render(USER, tools=tools, enable_thinking=False)
    assert "\n\nReasoning: low\n\n" in text and text.endswith("<|start|>assistant")
    ids = engine.tokenizer.encode(text)
    assert r.json()["input_tokens"] == len(ids)
    for token in ("<|start|>", "<|message|>", "<|end|>"):
        assert engine.tokenizer.token_to_id(token) in ids


@pytest.mark.parametrize("stream", [False, True])
def test_openai_required_yields_one_valid_call(tiny, stream):
    _, http = tiny
    message, finish = _chat(http, stream, tool_choice="required", temperature=0, **NO_THINKING)
    assert finish == "tool_calls"
    (call,) = message["tool_calls"]
    check_call(call["function"]["name"], call["function"]["arguments"])


@pytest.mark.parametrize("stream", [False, True])
def test_openai_named_tool_yields_that_tool(tiny, stream):
    _, http = tiny
    choice = {"type": "function", "function": {"name": "set_zip"}}
    message, finish = _chat(http, stream, tool_choice=choice, temperature=0.7, seed=3,
                            **NO_THINKING)
    assert finish == "tool_calls"
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["set_zip"]
    check_call("set_zip", message["tool_calls"][0]["function"]["arguments"])


def test_openai_forced_call_cut_by_max_tokens_is_length_without_calls(tiny):
    _, http = tiny
    message, finish = _chat(http, tool_choice="required", max_tokens=6, temperature=0,
                            **NO_THINKING)
    assert finish == "length" and not message.get("tool_calls")


def test_openai_required_with_thinking_may_reason_first(tiny):
    _, http = tiny
    message, finish = _chat(http, tool_choice="required", max_tokens=24, temperature=0)
    if finish == "tool_calls":
        check_call(message["tool_calls"][0]["function"]["name"],
                   message["tool_calls"][0]["function"]["arguments"])
    else:
        assert finish == "length" and message.get("reasoning_content")


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_any_and_tool_yield_valid_tool_use(tiny, stream):
    _, http = tiny
    blocks, stop = _messages(http, stream, tool_choice={"type": "any"}, temperature=0)
    assert stop == "tool_use"
    (use,) = [b for b in blocks if b["type"] == "tool_use"]
    check_call(use["name"], json.dumps(use["input"]))
    blocks, stop = _messages(http, stream, tool_choice={"type": "tool", "name": "search"},
                             temperature=1.0, seed=4)
    assert stop == "tool_use"
    assert [b["name"] for b in blocks if b["type"] == "tool_use"] == ["search"]


@pytest.mark.parametrize("stream", [False, True])
def test_unforced_answers_carry_no_format_tokens(tiny, stream):
    _, http = tiny
    for extra in ({}, NO_THINKING, {"reasoning_effort": "high"}):
        message, finish = _chat(http, stream, temperature=1.0, seed=11, max_tokens=64, **extra)
        assert finish in ("stop", "length", "tool_calls")
        shown = (message.get("content") or "") + (message.get("reasoning_content") or "")
        assert not any(token in shown for token in FORMAT_TOKENS), shown
    for thinking in (None, {"type": "adaptive"}):
        extra = {"thinking": thinking} if thinking else {}
        blocks, stop = _messages(http, stream, temperature=1.0, seed=5, max_tokens=64, **extra)
        assert stop in ("end_turn", "max_tokens", "tool_use")
        text = json.dumps(blocks)
        assert not any(token in text for token in FORMAT_TOKENS), text
