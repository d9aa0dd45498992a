"""Conformance: OpenAI Chat Completions details on the live server (real qwen3_next template and
OutputParser): message shapes clients send, output limits, usage chunk, reasoning split."""

from __future__ import annotations

import pytest

from tests.server.srv_conformance import oai_tool, real, srv_real  # noqa: F401

BASH = oai_tool("bash", {"command": {"type": "string"}})
USER = [{"role": "user", "content": "hi"}]


def test_assistant_content_null_with_tool_calls_is_accepted(srv_real):
    messages = [
        {"role": "developer", "content": "Be terse."},
        {"role": "user", "content": "list the files"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"command": "ls"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
    ]
    reply = srv_real.chat({"messages": messages, "tools": [BASH]}, "Done.\n</think>\n\nOne file.")
    assert reply.status == 200, reply.body
    assert reply.message["content"] == "One file."
    prompt = srv_real.prompt()
    assert prompt.startswith("<|im_start|>system\nBe terse.\n\n# Tools\n")
    assert prompt.endswith(
        "<|im_start|>user\nlist the files<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\na.txt\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )


@pytest.mark.parametrize("stream", [False, True])
def test_max_completion_tokens_is_honoured_with_finish_reason_length(srv_real, stream):
    body = {
        "messages": USER,
        "max_completion_tokens": 3,
        "max_tokens": 50,
        "chat_template_kwargs": {"enable_thinking": False},
        "stream": stream,
        "stream_options": {"include_usage": True} if stream else None,
    }
    script = "one two three four five six"
    reply = srv_real.chat(body, script)
    assert reply.status == 200, reply.body
    assert reply.finish_reason == "length"
    assert srv_real.engine.last.request.sampling.max_tokens == 3
    ids = srv_real.engine.tokenizer.encode(script)
    assert reply.message["content"] == srv_real.engine.tokenizer.decode(ids[:3])
    usage = reply.body["usage"] if not stream else reply.events[-2][1]["usage"]
    assert usage["completion_tokens"] == 3


def test_include_usage_adds_a_final_chunk_with_usage_and_no_choices(srv_real):
    body = {
        "messages": USER,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    srv_real.engine.push("Thinking.\n</think>\n\nHello.", cached_tokens=4)
    reply = srv_real.chat(body)
    n = len(srv_real.prompt_ids())
    *chunks, usage_chunk, done = reply.events
    assert done == (None, "[DONE]")
    assert usage_chunk[1]["choices"] == []
    generated = len(srv_real.engine.tokenizer.encode("Thinking.\n</think>\n\nHello."))
    assert usage_chunk[1]["usage"] == {
        "prompt_tokens": n,
        "completion_tokens": generated,
        "total_tokens": n + generated,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    assert all(data["usage"] is None and len(data["choices"]) == 1 for _, data in chunks)
    assert chunks[-1][1]["choices"][0]["finish_reason"] == "stop"
    assert (reply.message["reasoning_content"], reply.message["content"]) == ("Thinking.", "Hello.")


def test_stream_without_include_usage_has_no_usage_field(srv_real):
    reply = srv_real.chat({"messages": USER, "stream": True}, "x\n</think>\n\nHello.")
    assert reply.events[-1] == (None, "[DONE]")
    assert all("usage" not in data for _, data in reply.events[:-1])


@pytest.mark.parametrize(
    "stop, reasoning, content",
    [
        # a multi-token stop string spanning the close tag: no part of it, and no tag, leaks
        (["it.\n</think>\n\nThe"], "Plan ", None),
        (["\n\nThe"], "Plan it.", None),
        (["answer."], "Plan it.", "The "),
        (["zzz"], "Plan it.", "The answer."),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_content_split_with_stop_strings(srv_real, stop, reasoning, content, stream):
    body = {"messages": USER, "stop": stop, "stream": stream}
    reply = srv_real.chat(body, "Plan it.\n</think>\n\nThe answer.")
    assert reply.status == 200
    assert reply.finish_reason == "stop"
    assert reply.message["reasoning_content"] == reasoning
    assert (reply.message["content"] or None) == content
    if stream:
        pieces = [
            v
            for _, d in reply.events
            if d != "[DONE]"
            for v in d["choices"][0]["delta"].values()
            if isinstance(v, str)
        ]
        assert not any("<" in p for p in pieces), pieces


def test_stray_think_tags_never_reach_content(srv_real):
    """Thinking off: a ``</think>`` the model writes anyway is dropped; a ``<think>`` block it
    opens itself goes to ``reasoning_content``."""
    off = {"enable_thinking": False}
    for stream in (False, True):
        body = {"messages": USER, "chat_template_kwargs": off, "stream": stream}
        reply = srv_real.chat(body, "</think>\n\nHello.")
        assert reply.message["content"] == "Hello."
        assert "reasoning_content" not in reply.message
        reply = srv_real.chat(body, "<think>\nHmm.\n</think>\n\nHello.")
        assert (reply.message["content"], reply.message["reasoning_content"]) == ("Hello.", "Hmm.")
