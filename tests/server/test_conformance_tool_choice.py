"""Conformance: ``tool_choice`` through a live server on the real tiny qwen3_next engine.

OpenAI ``required`` / a named function and Anthropic ``any`` / ``tool`` yield a call (grammar-
constrained decoding: the random-weight model never writes one by itself) whose arguments satisfy
the schema, with ``finish_reason: tool_calls`` / ``stop_reason: tool_use``; a call cut off by
``max_tokens`` is ``length`` / ``max_tokens`` with no call; ``none`` yields no call even when the
model writes call markup (checked on a scripted engine). Streaming and not.
"""

from __future__ import annotations

import json

import httpx
import pytest
import torch

from freetoken.constrain import tool_call_grammar
from freetoken.engine.async_engine import AsyncEngine
from freetoken.models.tiny import default_model_path
from freetoken.server import ServerConfig, create_app
from tests.engine.constrained_schemas import SEARCH, TOOLS, ZIP, check_call
from tests.server.srv_fakes import FakeEngine
from tests.server.srv_live import LiveServer, json_events

USER = [{"role": "user", "content": "What is the weather in Oslo?"}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
ANT_TOOLS = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
             for t in TOOLS]
COMPILE_ERROR = ("tools: the tool schemas cannot be compiled into a grammar: tool 'f': failed to "
                 "compile JSON schema: Invalid type: strin")
CALL_TEXT = '<tool_call>\n{"name": "set_zip", "arguments": {"zip": "03106"}}\n</tool_call>'


class Live:
    """A live server and an httpx client."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.live = LiveServer(create_app(engine, ServerConfig(served_model_name="tiny",
                                                               max_output_tokens=256)))
        self.http = httpx.Client(base_url=self.live.base_url, timeout=60)

    def chat(self, **body) -> dict:
        r = self.http.post("/v1/chat/completions", json={"messages": USER, "tools": TOOLS, **body})
        assert r.status_code == 200, r.text
        return r.json()

    def chat_stream(self, **body) -> list[dict]:
        body = {"messages": USER, "tools": TOOLS, "stream": True, **body}
        with self.http.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            events = json_events(r.iter_lines())
        assert events[-1] == (None, "[DONE]")
        return [data for _, data in events[:-1]]

    def messages(self, **body) -> dict:
        r = self.http.post("/v1/messages", json={"max_tokens": 128, "messages": USER,
                                                 "tools": ANT_TOOLS, **body})
        assert r.status_code == 200, r.text
        return r.json()

    def messages_stream(self, **body) -> list[tuple[str, dict]]:
        body = {"max_tokens": 128, "messages": USER, "tools": ANT_TOOLS, "stream": True, **body}
        with self.http.stream("POST", "/v1/messages", json=body) as r:
            assert r.status_code == 200
            return json_events(r.iter_lines())

    def close(self) -> None:
        self.http.close()
        self.live.stop()


@pytest.fixture(scope="module")
def tiny():
    engine = AsyncEngine.from_pretrained(default_model_path(), dtype=torch.float32,
                                         max_model_len=2048)
    server = Live(engine)
    yield server
    server.close()
    engine.shutdown()


@pytest.fixture(scope="module")
def scripted():
    server = Live(FakeEngine(model_type="qwen3_next"))
    yield server
    server.close()


def streamed_calls(chunks: list[dict]) -> tuple[list[dict], str]:
    """OpenAI stream chunks -> ([{"name", "arguments"}], finish_reason)."""
    calls: dict[int, dict] = {}
    finish = None
    for chunk in chunks:
        for choice in chunk["choices"]:
            for delta in choice["delta"].get("tool_calls", []):
                call = calls.setdefault(delta["index"], {"name": "", "arguments": ""})
                call["name"] += delta.get("function", {}).get("name", "")
                call["arguments"] += delta.get("function", {}).get("arguments", "")
            finish = choice["finish_reason"] or finish
    return [calls[i] for i in sorted(calls)], finish


# ---------------------------------------------------------------- OpenAI, tiny engine
def test_openai_required_yields_one_valid_call(tiny):
    body = tiny.chat(tool_choice="required", parallel_tool_calls=False, temperature=0,
                     **NO_THINKING)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert choice["message"]["content"] is None and call["type"] == "function"
    check_call(call["function"]["name"], call["function"]["arguments"])


def test_openai_required_stream(tiny):
    chunks = tiny.chat_stream(tool_choice="required", parallel_tool_calls=False, temperature=1.0,
                              seed=2, **NO_THINKING)
    (call,), finish = streamed_calls(chunks)
    assert finish == "tool_calls"
    check_call(call["name"], call["arguments"])


@pytest.mark.parametrize("stream", [False, True])
def test_openai_named_tool_yields_that_tool(tiny, stream):
    choice = {"type": "function", "function": {"name": "set_zip"}}
    if stream:
        calls, finish = streamed_calls(tiny.chat_stream(tool_choice=choice, temperature=0.7,
                                                        seed=9, **NO_THINKING))
    else:
        msg = tiny.chat(tool_choice=choice, temperature=0.7, seed=9, **NO_THINKING)["choices"][0]
        calls = [c["function"] for c in msg["message"]["tool_calls"]]
        finish = msg["finish_reason"]
    assert finish == "tool_calls" and [c["name"] for c in calls] == ["set_zip"]
    check_call("set_zip", calls[0]["arguments"])


def test_openai_forced_call_cut_by_max_tokens_is_length_without_calls(tiny):
    choice = tiny.chat(tool_choice="required", max_tokens=12, temperature=0, **NO_THINKING)
    choice = choice["choices"][0]
    assert choice["finish_reason"] == "length" and "tool_calls" not in choice["message"]
    assert choice["message"]["content"] == ""  # the cut-off call's markup is not answer text


def test_openai_required_lets_an_open_think_block_run_first(tiny):
    """The tiny template opens a think block by default: reasoning is free (the random model does
    not close it within 16 tokens), so no call is made and the finish is an honest length."""
    choice = tiny.chat(tool_choice="required", max_tokens=16, temperature=0)["choices"][0]
    assert choice["finish_reason"] == "length" and "tool_calls" not in choice["message"]
    assert choice["message"]["reasoning_content"] and not choice["message"]["content"]


def test_openai_none_and_auto_make_no_call_on_the_tiny_model(tiny):
    for tool_choice in ("none", "auto"):
        choice = tiny.chat(tool_choice=tool_choice, temperature=0, **NO_THINKING)["choices"][0]
        assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]


# ---------------------------------------------------------------- Anthropic, tiny engine
def test_anthropic_any_yields_one_valid_tool_use(tiny):
    body = tiny.messages(tool_choice={"type": "any", "disable_parallel_tool_use": True},
                         temperature=0)
    assert body["stop_reason"] == "tool_use" and body["stop_sequence"] is None
    (block,) = body["content"]
    assert block["type"] == "tool_use" and block["id"].startswith("toolu_")
    check_call(block["name"], json.dumps(block["input"]))


def test_anthropic_tool_stream_yields_that_tool(tiny):
    events = tiny.messages_stream(tool_choice={"type": "tool", "name": "search"}, temperature=1.0,
                                  seed=4)
    starts = [d["content_block"] for n, d in events if n == "content_block_start"]
    assert [(b["type"], b["name"]) for b in starts] == [("tool_use", "search")]
    partial = "".join(d["delta"]["partial_json"] for n, d in events
                      if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta")
    check_call("search", partial)
    (delta,) = [d["delta"] for n, d in events if n == "message_delta"]
    assert delta == {"stop_reason": "tool_use", "stop_sequence": None}


def test_anthropic_forced_tool_cut_by_max_tokens_is_max_tokens_without_tool_use(tiny):
    body = tiny.messages(tool_choice={"type": "any"}, max_tokens=10, temperature=0)
    assert body["stop_reason"] == "max_tokens"
    assert body["content"] == []  # the cut-off call is neither a tool_use nor text


def test_anthropic_none_makes_no_tool_use_on_the_tiny_model(tiny):
    body = tiny.messages(tool_choice={"type": "none"}, temperature=0)
    assert body["stop_reason"] == "end_turn"
    assert all(b["type"] != "tool_use" for b in body["content"])


# ---------------------------------------------------------------- scripted engine
def test_none_reports_call_markup_as_text(scripted):
    scripted.engine.push(CALL_TEXT)
    choice = scripted.chat(tool_choice="none", **NO_THINKING)["choices"][0]
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    assert choice["message"]["content"] == CALL_TEXT
    assert scripted.engine.last.request.sampling.grammar is None
    scripted.engine.push(CALL_TEXT)
    body = scripted.messages(tool_choice={"type": "none"})
    assert body["stop_reason"] == "end_turn"
    assert body["content"] == [{"type": "text", "text": CALL_TEXT}]


@pytest.mark.parametrize(("api", "choice", "expected"), [
    ("openai", "auto", None),
    ("openai", "none", None),
    ("openai", "required", tool_call_grammar(TOOLS, "json")),
    ("openai", {"type": "function", "function": {"name": "search"}},
     tool_call_grammar(TOOLS, "json", only="search")),
    ("anthropic", {"type": "auto"}, None),
    ("anthropic", {"type": "any"}, tool_call_grammar(TOOLS, "json")),
    ("anthropic", {"type": "any", "disable_parallel_tool_use": True},
     tool_call_grammar(TOOLS, "json", parallel=False)),
    ("anthropic", {"type": "tool", "name": "set_zip"},
     tool_call_grammar(TOOLS, "json", only="set_zip")),
])
def test_the_engine_gets_the_grammar_of_the_choice(scripted, api, choice, expected):
    scripted.engine.push("ok")
    if api == "openai":
        scripted.chat(tool_choice=choice, **NO_THINKING)
    else:
        scripted.messages(tool_choice=choice)
    grammar = scripted.engine.last.request.sampling.grammar
    assert grammar == expected
    if expected is not None:
        first = grammar.tools[0]
        assert json.loads(first.parameters) == next(
            t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == first.name)


def test_parallel_tool_calls_false_and_open_think_block(scripted):
    scripted.engine.push("ok")
    scripted.chat(tool_choice="required", parallel_tool_calls=False)  # thinking on by default
    grammar = scripted.engine.last.request.sampling.grammar
    assert (grammar.parallel, grammar.reasoning, grammar.form) == (False, True, "json")


@pytest.mark.parametrize("model_type, form", [("qwen3_5_moe", "xml"), ("glm4_moe", "glm")])
def test_xml_and_glm_templates_get_their_forms(model_type, form):
    server = Live(FakeEngine(model_type=model_type))
    try:
        server.engine.push("ok")
        server.chat(tool_choice="required", tools=[ZIP, SEARCH], **NO_THINKING)
        expected = tool_call_grammar([ZIP, SEARCH], form)
        assert server.engine.last.request.sampling.grammar == expected
    finally:
        server.close()


def test_a_schema_that_cannot_be_compiled_is_a_400(scripted):
    bad = [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "strin"}}}}}]
    before = len(scripted.engine.logs)
    r = scripted.http.post("/v1/chat/completions",
                           json={"messages": USER, "tools": bad, "tool_choice": "required"})
    assert (r.status_code, r.json()) == (400, {"error": {
        "message": COMPILE_ERROR, "type": "invalid_request_error", "param": "tools", "code": None}})
    assert len(scripted.engine.logs) == before  # refused before reaching the engine
    r = scripted.http.post("/v1/messages", json={
        "max_tokens": 8, "messages": USER, "tool_choice": {"type": "any"},
        "tools": [{"name": "f", "input_schema": bad[0]["function"]["parameters"]}]})
    assert (r.status_code, r.json()) == (400, {"type": "error", "error": {
        "type": "invalid_request_error", "message": COMPILE_ERROR}})
