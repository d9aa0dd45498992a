"""/v1/messages and /v1/messages/count_tokens through the official anthropic SDK and raw JSON."""

from __future__ import annotations

import hashlib
import json
import re

import anthropic
import pytest

from tests.server.conftest import CAP

BASH = {
    "name": "bash",
    "description": "Run a shell command",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}
BASH_OPENAI_FORM = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command",
        "parameters": BASH["input_schema"],
    },
}
TOOLU = re.compile(r"^toolu_[A-Za-z0-9]{24}$")
USER = [{"role": "user", "content": "hi"}]


def tool_call_text(name: str, args: dict) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


@pytest.fixture
def client(srv):
    with anthropic.Anthropic(base_url=srv.base_url, api_key="unused", max_retries=0) as c:
        yield c


def test_non_streaming_shape_is_exact(srv):
    srv.engine.push("Hello world!", cached_tokens=2)
    r = srv.http.post(
        "/v1/messages", json={"model": "claude-x", "max_tokens": 50, "messages": USER}
    )
    assert r.status_code == 200
    body = r.json()
    assert re.match(r"^msg_[A-Za-z0-9]{24}$", body.pop("id"))
    n_prompt = len(srv.engine.last.request.prompt_ids)
    assert body == {
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [{"type": "text", "text": "Hello world!"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": n_prompt - 2,
            "output_tokens": len(srv.engine.tokenizer.encode("Hello world!")),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 2,
        },
    }


def test_sdk_create_and_stream(srv, client):
    srv.engine.push("Hi there, friend.")
    msg = client.messages.create(model="claude-local-alias", max_tokens=100, messages=USER)
    assert (msg.content[0].text, msg.stop_reason, msg.model) == (
        "Hi there, friend.",
        "end_turn",
        "claude-local-alias",
    )

    srv.engine.push("Hi there, friend.")
    with client.messages.stream(model="m", max_tokens=100, messages=USER) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Hi there, friend."
    assert [b.type for b in final.content] == ["text"]
    assert final.stop_reason == "end_turn"
    assert final.usage.input_tokens == len(srv.engine.last.request.prompt_ids)
    assert final.usage.output_tokens == len(srv.engine.tokenizer.encode("Hi there, friend."))


def test_tool_round_trip_with_tool_result(srv, client):
    srv.engine.push(tool_call_text("bash", {"command": "ls"}))
    msg = client.messages.create(model="m", max_tokens=100, messages=USER, tools=[BASH])
    assert msg.stop_reason == "tool_use"
    (use,) = msg.content  # no empty text block before the tool_use
    assert use.type == "tool_use" and TOOLU.match(use.id)
    assert (use.name, use.input) == ("bash", {"command": "ls"})
    assert srv.template.calls[-1]["tools"] == [BASH_OPENAI_FORM]

    srv.engine.push("The command failed.")
    history = USER + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": use.id,
                    "is_error": True,
                    "content": [{"type": "text", "text": "ls: permission denied"}],
                    "cache_control": {"type": "ephemeral"},
                },
                {"type": "text", "text": "<system-reminder>keep going</system-reminder>"},
            ],
        },
    ]
    msg2 = client.messages.create(model="m", max_tokens=100, messages=history, tools=[BASH])
    assert (msg2.content[0].text, msg2.stop_reason) == ("The command failed.", "end_turn")
    assert srv.template.calls[-1]["messages"] == [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": use.id,
                    "type": "function",
                    "function": {"name": "bash", "arguments": {"command": "ls"}},
                }
            ],
        },
        {"role": "tool", "content": "ls: permission denied", "tool_call_id": use.id},
        {"role": "user", "content": "<system-reminder>keep going</system-reminder>"},
    ]


def test_text_before_tool_results_renders_after_them(srv):
    # [text, tool_result, tool_result]: Anthropic's API wants the results first; harnesses that
    # send the text first mean the same turn, so each result stays right after its call.
    call = {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}}
    history = USER + [
        {"role": "assistant", "content": [call, {**call, "id": "toolu_2"}]},
        {"role": "user", "content": [
            {"type": "text", "text": "note"},
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.py"},
            {"type": "text", "text": "more"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "b.py"},
        ]},
    ]
    r = srv.http.post("/v1/messages", json={"max_tokens": 5, "messages": history,
                                            "tools": [BASH]})
    assert r.status_code == 200, r.text
    assert srv.template.calls[-1]["messages"][2:] == [
        {"role": "tool", "content": "a.py", "tool_call_id": "toolu_1"},
        {"role": "tool", "content": "b.py", "tool_call_id": "toolu_2"},
        {"role": "user", "content": "note\nmore"},
    ]
    # the prompt of the results alone is a prefix of it: the cached call and results are reused
    with_text = srv.prompt_text()
    history[-1]["content"] = [b for b in history[-1]["content"] if b["type"] == "tool_result"]
    srv.http.post("/v1/messages", json={"max_tokens": 5, "messages": history, "tools": [BASH]})
    results_only = srv.prompt_text()
    cut = results_only.rindex("<|im_start|>assistant")  # without the generation prompt
    assert with_text.startswith(results_only[:cut])
    assert with_text.index("b.py") < with_text.index("note\nmore")


def test_parallel_tool_uses_streamed_through_sdk(srv, client):
    srv.engine.push(
        "Two calls."
        + tool_call_text("bash", {"command": "ls"})
        + tool_call_text("bash", {"command": "pwd"})
    )
    with client.messages.stream(model="m", max_tokens=100, messages=USER, tools=[BASH]) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["text", "tool_use", "tool_use"]
    assert final.content[0].text == "Two calls."
    assert [b.input for b in final.content[1:]] == [{"command": "ls"}, {"command": "pwd"}]
    assert final.content[1].id != final.content[2].id
    assert final.stop_reason == "tool_use"


@pytest.mark.parametrize("stream", [False, True])
def test_thinking_blocks_carry_signatures(srv, client, stream):
    srv.engine.push("Plan: answer.\n</think>\n\nFour.")
    kwargs = dict(
        model="m",
        max_tokens=2048,
        messages=USER,
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    if stream:
        with client.messages.stream(**kwargs) as s:
            msg = s.get_final_message()
    else:
        msg = client.messages.create(**kwargs)
    assert srv.template.calls[-1]["enable_thinking"] is True
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[0].thinking == "Plan: answer.\n"
    assert msg.content[0].signature == hashlib.sha256(b"Plan: answer.\n").hexdigest()
    assert msg.content[1].text == "\n\nFour."


@pytest.mark.parametrize(
    ("thinking", "expected"),
    [
        (None, False),
        ({"type": "disabled"}, False),
        ({"type": "adaptive"}, True),
        ({"type": "enabled", "budget_tokens": 1024}, True),
    ],
)
def test_enable_thinking_decision(srv, thinking, expected):
    body = {
        "model": "m",
        "max_tokens": 2048,
        "messages": USER,
        **({"thinking": thinking} if thinking else {}),
    }
    assert srv.http.post("/v1/messages", json=body).status_code == 200
    assert srv.template.calls[-1]["enable_thinking"] is expected


def test_stop_sequence_and_max_tokens(srv, client):
    srv.engine.push("alpha beta END gamma")
    msg = client.messages.create(model="m", max_tokens=100, messages=USER, stop_sequences=["END"])
    assert (msg.content[0].text, msg.stop_reason, msg.stop_sequence) == (
        "alpha beta ",
        "stop_sequence",
        "END",
    )

    srv.engine.push("alpha beta END gamma")
    msg = client.messages.create(model="m", max_tokens=2, messages=USER)
    assert (msg.stop_reason, msg.usage.output_tokens) == ("max_tokens", 2)

    srv.engine.push("x ", endless=True)
    msg = client.messages.create(model="m", max_tokens=5000, messages=USER)
    assert srv.engine.last.request.sampling.length_capped
    assert (msg.stop_reason, msg.usage.output_tokens) == ("max_tokens", CAP)


def test_claude_code_shaped_request(srv):
    """System blocks (billing header dropped), a system turn inside messages, consecutive user
    turns, thinking history, redacted thinking and unknown fields: accepted, rendered in place."""
    body = {
        "model": "qwen-local",
        "max_tokens": 32000,
        "stream": False,
        "system": [
            {
                "type": "text",
                "text": "x-anthropic-billing-header: cc_version=2.1.197.123; cc_entrypoint=cli;",
            },
            {
                "type": "text",
                "text": "You are Claude Code.",
                "cache_control": {"type": "ephemeral"},
            },
            {"type": "text", "text": "Be concise."},
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
                    {"type": "text", "text": "fix the bug"},
                ],
            },
            {"role": "system", "content": "Agent types: Explore."},
            {"role": "user", "content": "please"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "look at main.py", "signature": "abc"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "text", "text": "Reading it."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "Read",
                        "input": {"path": "main.py"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "print(1)"}
                ],
            },
        ],
        "tools": [
            {
                "name": "Read",
                "input_schema": {"type": "object"},
                "cache_control": {"type": "ephemeral"},
            }
        ],
        "metadata": {"user_id": '{"device_id":"d"}'},
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
    }
    r = srv.http.post(
        "/v1/messages?beta=true",
        json=body,
        headers={"anthropic-beta": "claude-code-20250219", "anthropic-version": "2023-06-01"},
    )
    assert r.status_code == 200, r.text
    assert srv.template.calls[-1]["messages"] == [
        {"role": "system", "content": "You are Claude Code.\nBe concise."},
        {"role": "user", "content": "<system-reminder>ctx</system-reminder>\nfix the bug"},
        {"role": "system", "content": "Agent types: Explore."},
        {"role": "user", "content": "please"},
        {
            "role": "assistant",
            "content": "Reading it.",
            "reasoning_content": "look at main.py",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "Read", "arguments": {"path": "main.py"}},
                }
            ],
        },
        {"role": "tool", "content": "print(1)", "tool_call_id": "toolu_1"},
    ]
    assert srv.engine.last.request.sampling.max_tokens == CAP


@pytest.mark.parametrize(
    "path", ["/v1/messages/count_tokens", "/v1/messages/count_tokens?beta=true"]
)
def test_count_tokens(srv, path):
    body = {"model": "m", "system": "sys", "messages": USER, "tools": [BASH]}
    r = srv.http.post(path, json=body)
    prompt = srv.template.render(
        [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}],
        tools=[BASH_OPENAI_FORM],
        enable_thinking=False,
    )
    assert r.status_code == 200
    assert r.json() == {"input_tokens": len(srv.engine.tokenizer.encode(prompt))}
    assert srv.engine.logs == []  # counting never generates


def test_sdk_count_tokens(srv, client):
    count = client.messages.count_tokens(model="m", messages=USER)
    prompt = srv.template.render([{"role": "user", "content": "hi"}], enable_thinking=False)
    assert count.input_tokens == len(srv.engine.tokenizer.encode(prompt))
