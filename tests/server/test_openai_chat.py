"""/v1/chat/completions through the official openai SDK and raw SSE, against a live server."""

from __future__ import annotations

import json
import re

import openai
import pytest

from freetoken.core import SamplingParams
from tests.server.conftest import CAP
from tests.server.srv_live import json_events

BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}
CALL_ID = re.compile(r"^call_[A-Za-z0-9]{24}$")


def tool_call_text(name: str, args: dict) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


@pytest.fixture
def client(srv):
    with openai.OpenAI(base_url=srv.base_url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def n_tokens(srv, text: str) -> int:
    return len(srv.engine.tokenizer.encode(text))


def test_sdk_non_streaming_text(srv, client):
    srv.engine.push("Hello world!")
    resp = client.chat.completions.create(
        model="any-model-name",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
    )
    assert resp.id.startswith("chatcmpl-")
    assert resp.object == "chat.completion"
    assert resp.model == "any-model-name"
    choice = resp.choices[0]
    assert (choice.message.role, choice.message.content, choice.finish_reason) == (
        "assistant",
        "Hello world!",
        "stop",
    )
    assert choice.message.tool_calls is None
    prompt_ids = srv.engine.last.request.prompt_ids
    assert srv.prompt_text() == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert resp.usage.prompt_tokens == len(prompt_ids)
    assert resp.usage.completion_tokens == n_tokens(srv, "Hello world!")
    assert resp.usage.total_tokens == len(prompt_ids) + n_tokens(srv, "Hello world!")
    assert resp.usage.prompt_tokens_details.cached_tokens == 0
    assert srv.template.calls[-1]["enable_thinking"] is None


def test_sdk_streaming_with_include_usage(srv, client):
    srv.engine.push("Streaming works, token by token.", cached_tokens=3)
    stream = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "go"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Streaming works, token by token."
    assert (
        len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 3
    )  # really streamed
    *body, finish, usage = chunks
    assert finish.choices[0].finish_reason == "stop"
    assert all(c.usage is None for c in body + [finish])
    assert usage.choices == []
    assert usage.usage.prompt_tokens == len(srv.engine.last.request.prompt_ids)
    assert usage.usage.completion_tokens == n_tokens(srv, "Streaming works, token by token.")
    assert usage.usage.prompt_tokens_details.cached_tokens == 3
    assert {c.id for c in chunks} == {chunks[0].id} and chunks[0].model == "m"


def test_raw_stream_without_usage_ends_with_done(srv):
    srv.engine.push("ab")
    with srv.http.stream(
        "POST",
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "x"}], "stream": True},
    ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = json_events(r.iter_lines())
    assert events[-1] == (None, "[DONE]")
    datas = [d for _, d in events[:-1]]
    assert all("usage" not in d for d in datas)
    assert datas[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert datas[-1]["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert datas[0]["model"] == "fake-model"  # no model in the request: the served name


def test_max_tokens_above_cap_is_clamped_and_reported_as_length(srv, client):
    srv.engine.push("word ", endless=True)
    resp = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], max_tokens=1000
    )
    sp = srv.engine.last.request.sampling
    assert (sp.max_tokens, sp.length_capped) == (CAP, True)
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == CAP
    assert resp.choices[0].message.content == "word " * (CAP // n_tokens(srv, "word "))


def test_max_completion_tokens_and_default(srv, client):
    srv.engine.push("one two three four five six")
    resp = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], max_completion_tokens=3
    )
    ids = srv.engine.tokenizer.encode("one two three four five six")
    assert resp.choices[0].message.content == srv.engine.tokenizer.decode(ids[:3])
    assert resp.choices[0].finish_reason == "length"
    assert (
        srv.engine.last.request.sampling.max_tokens,
        srv.engine.last.request.sampling.length_capped,
    ) == (3, False)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert (
        srv.engine.last.request.sampling.max_tokens,
        srv.engine.last.request.sampling.length_capped,
    ) == (CAP, False)


@pytest.mark.parametrize(
    ("stop", "content"),
    [("three", "one two "), (["four", "two"], "one "), (["absent"], "one two three four")],
)
def test_stop_strings(srv, client, stop, content):
    srv.engine.push("one two three four")
    resp = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], stop=stop
    )
    assert resp.choices[0].message.content == content
    assert resp.choices[0].finish_reason == "stop"
    assert srv.engine.last.request.sampling.stop == (
        (stop,) if isinstance(stop, str) else tuple(stop)
    )


def test_sampling_fields_are_forwarded(srv, client):
    client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "x"}],
        temperature=0.2,
        top_p=0.9,
        seed=7,
        max_tokens=9,
        extra_body={"top_k": 5, "ignore_eos": True},
    )
    assert srv.engine.last.request.sampling == SamplingParams(
        max_tokens=9, temperature=0.2, top_p=0.9, top_k=5, seed=7, stop=(), ignore_eos=True
    )


def test_tool_round_trip(srv, client):
    srv.engine.push(tool_call_text("bash", {"command": "ls -la"}))
    messages = [{"role": "user", "content": "list files"}]
    resp = client.chat.completions.create(
        model="m", messages=messages, tools=[BASH], tool_choice="auto"
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert CALL_ID.match(call.id) and call.type == "function"
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "bash",
        {"command": "ls -la"},
    )
    assert srv.template.calls[-1]["tools"] == [BASH]

    srv.engine.push("There are no files.")
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "total 0"},
    ]
    resp2 = client.chat.completions.create(model="m", messages=messages, tools=[BASH])
    assert (resp2.choices[0].message.content, resp2.choices[0].finish_reason) == (
        "There are no files.",
        "stop",
    )
    assert srv.template.calls[-1]["messages"] == [
        {"role": "user", "content": "list files"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": "bash", "arguments": {"command": "ls -la"}},
                }
            ],
        },
        {"role": "tool", "content": "total 0", "tool_call_id": call.id},
    ]


def test_streamed_parallel_tool_calls_have_distinct_indexes(srv):
    srv.engine.push(
        "Checking."
        + tool_call_text("bash", {"command": "ls"})
        + tool_call_text("bash", {"command": "pwd"})
    )
    body = {"messages": [{"role": "user", "content": "x"}], "tools": [BASH], "stream": True}
    with srv.http.stream("POST", "/v1/chat/completions", json=body) as r:
        deltas = [d["choices"][0] for _, d in json_events(r.iter_lines()) if d != "[DONE]"]
    calls = [c["delta"]["tool_calls"][0] for c in deltas if "tool_calls" in c["delta"]]
    assert len(calls) == 4
    first, first_args, second, second_args = calls
    assert first["index"] == 0 and second["index"] == 1
    for head in (first, second):
        assert set(head) == {"index", "id", "type", "function"} and CALL_ID.match(head["id"])
        assert head["type"] == "function" and head["function"] == {"name": "bash", "arguments": ""}
    assert first["id"] != second["id"]
    assert first_args == {"index": 0, "function": {"arguments": '{"command": "ls"}'}}
    assert second_args == {"index": 1, "function": {"arguments": '{"command": "pwd"}'}}
    assert "".join(c["delta"].get("content") or "" for c in deltas) == "Checking."
    assert deltas[-1]["finish_reason"] == "tool_calls"


def test_sdk_stream_accumulates_parallel_calls(srv, client):
    srv.engine.push(
        tool_call_text("bash", {"command": "ls"}) + tool_call_text("bash", {"command": "pwd"})
    )
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], tools=[BASH], stream=True
    )
    args: dict[int, str] = {}
    for chunk in stream:
        for tc in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            args[tc.index] = args.get(tc.index, "") + (tc.function.arguments or "")
    assert {i: json.loads(a) for i, a in args.items()} == {
        0: {"command": "ls"},
        1: {"command": "pwd"},
    }


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "bash"}}])
def test_forced_tool_choice_without_a_call_reports_stop(srv, client, choice):
    srv.engine.push("I will not call a tool.")
    resp = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], tools=[BASH], tool_choice=choice
    )
    assert resp.choices[0].finish_reason == "stop"
    assert resp.choices[0].message.tool_calls is None
    assert resp.choices[0].message.content == "I will not call a tool."


def test_tool_choice_none_does_not_parse_calls(srv, client):
    text = "Answer " + tool_call_text("bash", {"command": "ls"})
    srv.engine.push(text)
    resp = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], tools=[BASH], tool_choice="none"
    )
    assert (resp.choices[0].message.content, resp.choices[0].finish_reason) == (text, "stop")
    assert srv.template.calls[-1]["tools"] == [BASH]  # tools stay in the prompt


def test_reasoning_content_non_streaming_and_streaming(srv, client):
    kwargs = dict(
        model="m",
        messages=[{"role": "user", "content": "x"}],
        extra_body={"chat_template_kwargs": {"enable_thinking": True}},
    )
    srv.engine.push("Let me think.\n</think>\n\nThe answer is 4.")
    resp = client.chat.completions.create(**kwargs)
    msg = resp.choices[0].message
    assert srv.prompt_text().endswith("<|im_start|>assistant\n<think>\n")
    assert (msg.reasoning_content, msg.content) == ("Let me think.\n", "\n\nThe answer is 4.")

    srv.engine.push("Let me think.\n</think>\n\nThe answer is 4.")
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    reasoning = "".join(
        getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert (reasoning, content) == ("Let me think.\n", "\n\nThe answer is 4.")


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({}, None),
        ({"reasoning_effort": "none"}, False),
        ({"reasoning_effort": "high"}, True),
        ({"chat_template_kwargs": {"enable_thinking": False}, "reasoning_effort": "high"}, False),
    ],
)
def test_enable_thinking_decision(srv, extra, expected):
    r = srv.http.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], **extra}
    )
    assert r.status_code == 200
    assert srv.template.calls[-1]["enable_thinking"] is expected


def test_message_normalisation(srv):
    messages = [
        {"role": "developer", "content": "Dev rules."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}],
        },
        {"role": "user", "content": "second user turn"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "thinking before the call",
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"command": "ls"}'},
                },
                {
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "bash", "arguments": "not json {"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": [{"type": "text", "text": "a.txt"}]},
        {"role": "tool", "tool_call_id": "call_b", "content": "error"},
    ]
    r = srv.http.post("/v1/chat/completions", json={"messages": messages, "tools": [BASH]})
    assert r.status_code == 200, r.text
    assert srv.template.calls[-1]["messages"] == [
        {"role": "system", "content": "Dev rules."},
        {"role": "user", "content": "part one\npart two"},
        {"role": "user", "content": "second user turn"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "thinking before the call",
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "bash", "arguments": {"command": "ls"}},
                },
                {
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "bash", "arguments": "not json {"},
                },
            ],
        },
        {"role": "tool", "content": "a.txt", "tool_call_id": "call_a"},
        {"role": "tool", "content": "error", "tool_call_id": "call_b"},
    ]
