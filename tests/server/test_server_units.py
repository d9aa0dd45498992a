"""Pure pieces of the HTTP layer: config validation, sampling clamps, the context check, the
Anthropic block state machine, error paths and message normalisation edge cases."""

from __future__ import annotations

import hashlib

import pytest

from freetoken.core import SamplingParams
from freetoken.parsers.events import ReasoningDelta, TextDelta, ToolCallEvent
from freetoken.server import ServerConfig
from freetoken.server.anthropic_blocks import BlockBuilder
from freetoken.server.anthropic_protocol import AnthropicMessage
from freetoken.server.errors import APIError, field_path
from freetoken.server.messages import anthropic_system, from_anthropic
from freetoken.server.middleware import presented_key
from freetoken.server.prompt import check_context
from freetoken.server.sampling import build_sampling


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_output_tokens": 0}, "max_output_tokens must be >= 1, got 0"),
        (
            {"default_max_tokens": 100, "max_output_tokens": 50},
            "default_max_tokens must be in [1, max_output_tokens=50], got 100",
        ),
        ({"api_key": ""}, "api_key must be None (no auth) or a non-empty string"),
        ({"max_body_bytes": 0}, "max_body_bytes must be >= 1, got 0"),
        ({"ping_interval_s": 0}, "ping_interval_s must be > 0, got 0"),
        ({"served_model_name": ""}, "served_model_name must be a non-empty string"),
    ],
)
def test_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError) as info:
        ServerConfig(**kwargs)
    assert str(info.value) == message


def _sampling(requested, prompt_len=10, max_model_len=1000, **cfg):
    config = ServerConfig(max_output_tokens=100, **cfg)
    return build_sampling(
        config=config,
        requested_max_tokens=requested,
        prompt_len=prompt_len,
        max_model_len=max_model_len,
        temperature=None,
        top_p=None,
        top_k=-1,
        seed=None,
        stop=(),
        ignore_eos=False,
    )


def test_sampling_limits():
    assert _sampling(None) == SamplingParams(max_tokens=100, temperature=1.0, top_p=1.0, top_k=0)
    assert _sampling(None, default_max_tokens=20).max_tokens == 20
    assert (_sampling(50).max_tokens, _sampling(50).length_capped) == (50, False)
    assert (_sampling(500).max_tokens, _sampling(500).length_capped) == (100, True)  # server cap
    room = _sampling(80, prompt_len=990)  # only 10 tokens of context left
    assert (room.max_tokens, room.length_capped) == (10, True)


def test_context_boundary():
    check_context(9, 10, "openai", "messages")  # 9 + 1 == 10 fits
    with pytest.raises(APIError) as info:
        check_context(10, 10, "anthropic", "messages")
    assert (info.value.status, info.value.message) == (
        400,
        "prompt is too long: 10 tokens > 9 maximum",
    )
    with pytest.raises(APIError) as info:
        check_context(10, 10, "openai", "prompt")
    assert (info.value.code, info.value.param) == ("context_length_exceeded", "prompt")


def _ids():
    counter = iter(range(100))
    return lambda: f"toolu_{next(counter)}"


def test_blocks_blank_text_before_tool_use_is_dropped():
    b = BlockBuilder(_ids())
    assert b.feed(TextDelta("\n\n")) == []
    out = b.feed(ToolCallEvent(0, "bash", '{"a": 1}'))
    assert [p["type"] for p in out] == [
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
    ]
    assert out[0] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "tool_use", "id": "toolu_0", "name": "bash", "input": {}},
    }
    assert b.feed(TextDelta(" ")) == [] and b.close() == []
    assert b.blocks == [{"type": "tool_use", "id": "toolu_0", "name": "bash", "input": {"a": 1}}]


def test_blocks_blank_prefix_is_kept_once_text_follows():
    b = BlockBuilder(_ids())
    b.feed(TextDelta("\n"))
    out = b.feed(TextDelta("Hi"))
    assert out == [
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": "\nHi"},
        },
    ]
    assert b.close() == [{"type": "content_block_stop", "index": 0}]
    assert b.blocks == [{"type": "text", "text": "\nHi"}]


def test_blocks_interleaved_thinking_each_signed():
    b = BlockBuilder(_ids())
    for event in (
        ReasoningDelta("a"),
        ReasoningDelta("b"),
        TextDelta("x"),
        ReasoningDelta("  "),
        ReasoningDelta("c"),
    ):
        b.feed(event)
    b.close()
    sig = lambda t: hashlib.sha256(t.encode()).hexdigest()  # noqa: E731
    assert b.blocks == [
        {"type": "thinking", "thinking": "ab", "signature": sig("ab")},
        {"type": "text", "text": "x"},
        {"type": "thinking", "thinking": "  c", "signature": sig("  c")},
    ]


def test_blocks_bad_arguments_become_empty_input_but_stream_verbatim():
    b = BlockBuilder(_ids())
    out = b.feed(ToolCallEvent(0, "bash", "[1, 2]"))
    assert out[1]["delta"] == {"type": "input_json_delta", "partial_json": "[1, 2]"}
    assert b.blocks[0]["input"] == {}


def test_field_path_drops_union_labels():
    assert field_path(("messages", 0, "content", "str")) == "messages.0.content"
    assert field_path(("prompt", "list[int]", 2)) == "prompt.2"
    assert field_path(("tool_choice", "function-after[x]", "type")) == "tool_choice.type"


@pytest.mark.parametrize(
    ("headers", "key"),
    [
        ({b"authorization": b"Bearer abc"}, "abc"),
        ({b"authorization": b"bearer  abc "}, "abc"),
        ({b"x-api-key": b"xyz"}, "xyz"),
        ({b"authorization": b"Basic abc"}, None),
        ({}, None),
    ],
)
def test_presented_key(headers, key):
    assert presented_key(headers) == key


def test_anthropic_edge_cases():
    assert anthropic_system("") == []
    # kept here; the Claude Code adapter removes it before templating
    assert anthropic_system(
        [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1;"}, {"type": "text", "text": "b"}]
    ) == [{"role": "system", "content": "x-anthropic-billing-header: cc_version=1;\nb"}]
    msgs = [
        AnthropicMessage(role="user", content=[]),
        AnthropicMessage(
            role="user", content=[{"type": "tool_result", "tool_use_id": "t1", "is_error": True}]
        ),
        AnthropicMessage(role="assistant", content="plain"),
    ]
    assert from_anthropic("S", msgs) == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": ""},
        {"role": "tool", "content": "Error", "tool_call_id": "t1"},
        {"role": "assistant", "content": "plain"},
    ]
