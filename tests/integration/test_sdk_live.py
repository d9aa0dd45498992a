"""Acceptance: the official openai and anthropic SDKs against a real `freetoken serve` process
running the embedded tiny qwen3_next model with a small output cap."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from freetoken.chat.template import ChatTemplate
from freetoken.tokenizer.tokenizer import Tokenizer
from tests.clients.server import ServerProcess

CAP = 24
TOOLS_OAI = [{
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                       "required": ["command"]},
    },
}]
TOOLS_ANT = [{"name": "bash", "description": "Run a shell command",
              "input_schema": TOOLS_OAI[0]["function"]["parameters"]}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    proc = ServerProcess.start(log, served_model_name="tiny-next", max_output_tokens=CAP)
    try:
        yield proc.base_url, log
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def oai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key="dummy", max_retries=0)


@pytest.fixture(scope="module")
def ant(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server[0], api_key="dummy", max_retries=0)


def _served_tokenizer_and_template(server) -> tuple[Tokenizer, ChatTemplate]:
    from freetoken.models.tiny import default_model_path

    path = default_model_path()
    tok = Tokenizer.from_pretrained(path)
    return tok, ChatTemplate.for_model(tok.chat_template, "qwen3_next")


def _prompt_tokens(usage) -> int:
    """Anthropic input_tokens excludes prefix-cache reads; the prompt is their sum."""
    return usage.input_tokens + (usage.cache_read_input_tokens or 0)


def test_startup_report_order(server) -> None:
    text = Path(server[1]).read_text()
    # the port answers first (503 while loading), then the model is loaded and ready
    marks = ["loading", "listening on", "/v1/chat/completions", "/v1/messages", "loaded",
             "model 'tiny-next' ready"]
    positions = [text.find(m) for m in marks]
    assert all(p >= 0 for p in positions), text
    assert positions == sorted(positions), text


def test_models_lists_served_name(oai: openai.OpenAI) -> None:
    assert [m.id for m in oai.models.list().data] == ["tiny-next"]


def test_openai_stream_equals_non_stream(oai: openai.OpenAI) -> None:
    kwargs = dict(model="gpt-whatever", messages=[{"role": "user", "content": "Say hi"}],
                  temperature=0, max_tokens=12)
    full = oai.chat.completions.create(**kwargs)
    assert full.model == "gpt-whatever"
    assert full.usage.completion_tokens <= 12
    text = ""
    reasoning = ""
    chunks = oai.chat.completions.create(**kwargs, stream=True,
                                         stream_options={"include_usage": True})
    usage = None
    for chunk in chunks:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            reasoning += getattr(choice.delta, "reasoning_content", None) or ""
    assert text == (full.choices[0].message.content or "")
    assert usage is not None and usage.completion_tokens == full.usage.completion_tokens
    assert usage.prompt_tokens == full.usage.prompt_tokens


def test_repeated_request_reports_the_reused_prefix(oai: openai.OpenAI,
                                                   ant: anthropic.Anthropic) -> None:
    """The second identical request reuses all but its last prompt token (prefix cache:
    radix tree + the generation-start checkpoints of the first one), and says so in usage."""
    messages = [{"role": "user", "content": "Prefix reuse probe 5d1c: describe the repo."}]
    first = oai.chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=3)
    again = oai.chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=3)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens == first.usage.prompt_tokens
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    assert again.choices[0].message.content == first.choices[0].message.content
    kwargs = dict(model="c", max_tokens=3, extra_body={"temperature": 0},
                  messages=[{"role": "user", "content": "Prefix reuse probe 9e2a: list files."}])
    one, two = ant.messages.create(**kwargs), ant.messages.create(**kwargs)
    assert (one.usage.cache_read_input_tokens or 0) == 0
    assert two.usage.cache_read_input_tokens == _prompt_tokens(one.usage) - 1
    assert two.usage.input_tokens == 1


def test_streamed_message_start_reports_the_reused_prefix(ant: anthropic.Anthropic) -> None:
    """message_start (not only message_delta) splits the prompt into cache reads and recomputed
    input: Claude Code's context meter reads it there."""
    kwargs = dict(model="c", max_tokens=3, extra_body={"temperature": 0},
                  messages=[{"role": "user", "content": "Prefix reuse probe 4f7b: streamed."}])
    starts = []
    for _ in range(2):
        with ant.messages.stream(**kwargs) as stream:
            start = next(e for e in stream if e.type == "message_start")
            final = stream.get_final_message()
        starts.append(start.message.usage)
        assert _prompt_tokens(start.message.usage) == _prompt_tokens(final.usage)
        assert start.message.usage.cache_read_input_tokens == final.usage.cache_read_input_tokens
    assert (starts[0].cache_read_input_tokens, starts[0].cache_creation_input_tokens) == (0, 0)
    assert starts[1].cache_read_input_tokens == _prompt_tokens(starts[0]) - 1
    assert starts[1].input_tokens == 1


def test_openai_ignore_eos_and_cap(oai: openai.OpenAI) -> None:
    out = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                      max_tokens=7, extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 7
    assert out.choices[0].finish_reason == "length"
    capped = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                         max_tokens=10_000, extra_body={"ignore_eos": True})
    assert capped.usage.completion_tokens == CAP
    assert capped.choices[0].finish_reason == "length"


def test_openai_tool_round_trip(server, oai: openai.OpenAI) -> None:
    messages = [
        {"role": "user", "content": "List the files"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": "ls"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "README.md\nsetup.py"},
    ]
    out = oai.chat.completions.create(model="m", messages=messages, tools=TOOLS_OAI,
                                      temperature=0, max_tokens=8)
    tok, template = _served_tokenizer_and_template(server)
    rendered = template.render(
        [messages[0], {**messages[1], "content": "", "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "bash", "arguments": {"command": "ls"}}}]}, messages[2]],
        tools=TOOLS_OAI)
    assert "<tool_response>\nREADME.md\nsetup.py\n</tool_response>" in rendered
    assert out.usage.prompt_tokens == len(tok.encode(rendered))
    assert out.choices[0].finish_reason in {"stop", "length", "tool_calls"}


def test_anthropic_stream_equals_non_stream(ant: anthropic.Anthropic) -> None:
    kwargs = dict(model="claude-test-model", max_tokens=10, extra_body={"temperature": 0},
                  messages=[{"role": "user", "content": "Say hi"}])
    full = ant.messages.create(**kwargs)
    assert full.model == "claude-test-model"
    with ant.messages.stream(**kwargs) as stream:
        final = stream.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in full.content]
    assert _prompt_tokens(final.usage) == _prompt_tokens(full.usage)
    assert final.usage.output_tokens == full.usage.output_tokens
    counted = ant.messages.count_tokens(model="x", messages=kwargs["messages"])
    assert counted.input_tokens == _prompt_tokens(full.usage)


def test_anthropic_tool_round_trip(ant: anthropic.Anthropic) -> None:
    messages = [
        {"role": "user", "content": "List the files"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Listing."},
            {"type": "tool_use", "id": "toolu_01", "name": "bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": "README.md",
             "is_error": False}]},
    ]
    out = ant.messages.create(model="claude-x", max_tokens=8, extra_body={"temperature": 0},
                              tools=TOOLS_ANT, messages=messages)
    assert out.stop_reason in {"end_turn", "max_tokens", "tool_use"}
    counted = ant.messages.count_tokens(model="claude-x", tools=TOOLS_ANT, messages=messages)
    assert counted.input_tokens == _prompt_tokens(out.usage)
    shorter = ant.messages.count_tokens(model="claude-x", tools=TOOLS_ANT, messages=messages[:1])
    assert shorter.input_tokens < counted.input_tokens


def test_server_healthy_after_bad_input(server) -> None:
    base = server[0]
    bad = httpx.post(f"{base}/v1/chat/completions", content=b"{not json",
                     headers={"content-type": "application/json"})
    assert bad.status_code == 400
    assert bad.json()["error"]["type"] == "invalid_request_error"
    huge = httpx.post(f"{base}/v1/messages", json={
        "model": "m", "max_tokens": 4,
        "messages": [{"role": "user", "content": "word " * 300_000}]}, timeout=120)
    assert huge.status_code in {400, 413}
    assert huge.json()["type"] == "error"
    assert httpx.get(f"{base}/health").status_code == 200
