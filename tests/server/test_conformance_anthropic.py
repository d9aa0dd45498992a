"""Conformance: Anthropic Messages details on the live server (real qwen3_next template and
OutputParser): count_tokens, usage, stop reasons, thinking blocks."""

from __future__ import annotations

import pytest

from tests.server.srv_conformance import ant_tool, real, srv_real  # noqa: F401

BASH = ant_tool("bash", {"command": {"type": "string"}})
THINK = {"type": "enabled", "budget_tokens": 1024}
CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
HISTORY = [
    {"role": "user", "content": "list the files"},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Use ls.", "signature": "abc"},
            {"type": "text", "text": "Listing."},
            {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": [{"type": "text", "text": "a.txt"}],
            },
            {"type": "text", "text": "Now count them."},
        ],
    },
    {"role": "system", "content": "Reminder: be brief."},
]
COUNT_CASES = {
    "plain": {"messages": [{"role": "user", "content": "hi"}]},
    "system blocks, tools, thinking": {
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.0; cch=1a2b3;"},
            {
                "type": "text",
                "text": "You are a coding agent.",
                "cache_control": {"type": "ephemeral"},
            },
        ],
        "tools": [BASH],
        "thinking": THINK,
        "max_tokens": 2048,
        "messages": HISTORY,
    },
    "history without thinking": {"tools": [BASH], "messages": HISTORY},
}


@pytest.mark.parametrize("case", sorted(COUNT_CASES))
def test_count_tokens_equals_the_prompt_of_the_same_request(srv_real, case):
    body = {"model": "claude-x", **COUNT_CASES[case]}
    r = srv_real.http.post(
        "/v1/messages/count_tokens?beta=true",
        json=body,
        headers={"anthropic-beta": "token-counting-2024-11-01", "anthropic-version": "2023-06-01"},
    )
    assert r.status_code == 200, r.text
    counted = r.json()
    for stream in (False, True):
        reply = srv_real.message({**body, "stream": stream}, "Done.")
        assert reply.status == 200, reply.body
        assert counted == {"input_tokens": len(srv_real.prompt_ids())}


def test_message_start_usage_is_the_real_prompt_count(srv_real):
    srv_real.engine.push("Two files.", cached_tokens=5)
    reply = srv_real.message({"tools": [BASH], "messages": HISTORY, "stream": True})
    n = len(srv_real.prompt_ids())
    start = reply.events[0][1]["message"]["usage"]  # the split is known at admission already
    assert (start["input_tokens"], start["cache_read_input_tokens"]) == (n - 5, 5) and n > 100
    final = reply.message["usage"]
    assert (final["input_tokens"], final["cache_read_input_tokens"]) == (n - 5, 5)
    assert final["output_tokens"] == len(srv_real.engine.tokenizer.encode("Two files."))


@pytest.mark.parametrize("lead", ["", "\n\n", "  \n", " "])
@pytest.mark.parametrize("stream", [False, True])
def test_tool_turn_is_tool_use_without_an_empty_text_block(srv_real, lead, stream):
    body = {"tools": [BASH], "messages": HISTORY[:1], "stream": stream}
    reply = srv_real.message(body, lead + CALL)
    assert reply.status == 200
    assert reply.message["stop_reason"] == "tool_use"
    assert reply.message["stop_sequence"] is None
    ((block),) = reply.message["content"]
    assert (block["type"], block["name"], block["input"]) == ("tool_use", "bash", {"command": "ls"})
    if stream:
        kinds = [d["content_block"]["type"] for n, d in reply.events if n == "content_block_start"]
        assert kinds == ["tool_use"]
        assert reply.events[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}


@pytest.mark.parametrize("stream", [False, True])
def test_matched_stop_sequence_is_reported(srv_real, stream):
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "stop_sequences": ["never", "END OF ANSWER"],
        "stream": stream,
    }
    reply = srv_real.message(body, "The answer is 4. END OF ANSWER and more text")
    assert reply.status == 200
    msg = reply.message
    assert (msg["stop_reason"], msg["stop_sequence"]) == ("stop_sequence", "END OF ANSWER")
    assert msg["content"] == [{"type": "text", "text": "The answer is 4. "}]


@pytest.mark.parametrize("stream", [False, True])
def test_end_turn_and_max_tokens_report_no_stop_sequence(srv_real, stream):
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "stop_sequences": ["zzz"],
        "stream": stream,
    }
    reply = srv_real.message(body, "Short.")
    assert (reply.message["stop_reason"], reply.message["stop_sequence"]) == ("end_turn", None)
    reply = srv_real.message({**body, "max_tokens": 2}, "one two three four five")
    assert (reply.message["stop_reason"], reply.message["stop_sequence"]) == ("max_tokens", None)
    assert reply.message["usage"]["output_tokens"] == 2


def _thinking_block(msg: dict) -> dict:
    block = msg["content"][0]
    assert block["type"] == "thinking"
    assert len(block["signature"]) == 64 and block["signature"].strip()
    return block


def test_thinking_blocks_are_signed_and_stable_across_modes(srv_real):
    body = {"messages": [{"role": "user", "content": "hi"}], "thinking": THINK, "max_tokens": 2048}
    script = "Plan the answer.\n</think>\n\nThe answer."
    plain = srv_real.message(body, script).message
    streamed = srv_real.message({**body, "stream": True}, script)
    assert plain["content"] == streamed.message["content"]
    block = _thinking_block(plain)
    assert block["thinking"] == "Plan the answer."
    assert plain["content"][1:] == [{"type": "text", "text": "The answer."}]
    deltas = [d["delta"]["type"] for n, d in streamed.events if n == "content_block_delta"]
    first_stop = next(i for i, (n, _) in enumerate(streamed.events) if n == "content_block_stop")
    assert streamed.events[first_stop - 1][1]["delta"]["type"] == "signature_delta"
    assert "signature_delta" in deltas
    start = next(d for n, d in streamed.events if n == "content_block_start")
    assert start["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}


@pytest.mark.parametrize(
    "stop, content, reason",
    [
        # the stop string right after the think block: the answer never starts
        ("\n\nThe", [("thinking", "Plan it.")], "stop_sequence"),
        # a multi-token stop string across the close tag: nothing of it, and no tag, leaks
        ("it.\n</th", [("thinking", "Plan ")], "stop_sequence"),
        # inside the answer
        ("answer.", [("thinking", "Plan it."), ("text", "The ")], "stop_sequence"),
        # matches nothing: the whole output
        ("zzz", [("thinking", "Plan it."), ("text", "The answer.")], "end_turn"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_thinking_with_stop_sequences_never_leaks_tags(srv_real, stop, content, reason, stream):
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "thinking": THINK,
        "max_tokens": 2048,
        "stop_sequences": [stop],
        "stream": stream,
    }
    msg = srv_real.message(body, "Plan it.\n</think>\n\nThe answer.").message
    got = [(b["type"], b.get("thinking", b.get("text"))) for b in msg["content"]]
    assert got == content
    assert (msg["stop_reason"], msg["stop_sequence"]) == (
        reason,
        stop if reason == "stop_sequence" else None,
    )
    _thinking_block(msg)


def test_thinking_off_output_with_a_stray_close_tag_stays_text(srv_real):
    """Thinking not requested (the prompt pre-fills an empty think block): a ``</think>`` the
    model writes anyway is dropped, never shown as text."""
    for stream in (False, True):
        body = {"messages": [{"role": "user", "content": "hi"}], "stream": stream}
        msg = srv_real.message(body, "</think>\n\nHello.").message
        assert msg["content"] == [{"type": "text", "text": "Hello."}]
