"""Normalisation: Claude Code's attribution line goes, everything else stays byte for byte."""

from __future__ import annotations

import copy

import pytest

from freetoken.server import messages as server_messages
from freetoken.server.anthropic_protocol import AnthropicMessage
from harness_adapters import adapter_names, get_adapter
from harness_adapters.claude_code import BILLING_HEADER_PREFIX
from tests.harness_adapters.client_requests import BILLING_LINE

CC = get_adapter("claude_code")
CALL = {"id": "toolu_1", "type": "function", "function": {"name": "Bash", "arguments": {"command": "ls"}}}


def _history(system: str) -> list[dict]:
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": "say hi"},
        {"role": "system", "content": "<total_tokens>9000 tokens left</total_tokens>"},
        {"role": "assistant", "content": "", "reasoning_content": "list", "tool_calls": [CALL]},
        {"role": "tool", "content": "a.txt\n", "tool_call_id": "toolu_1"},
    ]


def test_removes_exactly_the_attribution_line() -> None:
    msgs = _history(f"{BILLING_LINE}\nYou are Claude Code.\n\n  Env: linux  \n")
    before = copy.deepcopy(msgs)
    out = CC.normalize(msgs)
    assert out is not msgs and msgs == before
    assert out[0] == {"role": "system", "content": "You are Claude Code.\n\n  Env: linux  \n"}
    assert all(out[i] is msgs[i] for i in range(1, len(msgs)))  # shared, not copied
    assert [m["role"] for m in out] == ["system", "user", "system", "assistant", "tool"]  # not hoisted


def test_a_system_prompt_of_only_the_line_is_dropped() -> None:
    msgs = _history(BILLING_LINE)
    out = CC.normalize(msgs)
    assert out == msgs[1:] and all(a is b for a, b in zip(out, msgs[1:]))


@pytest.mark.parametrize("system", [
    "You are Claude Code.",
    f"You are Claude Code.\n{BILLING_LINE}",  # not at the top: left alone
    f" {BILLING_LINE}\nYou are Claude Code.",
])
def test_nothing_to_do_returns_the_same_list(system: str) -> None:
    msgs = _history(system)
    assert CC.normalize(msgs) is msgs
    assert CC.normalize([]) == []
    user_first = [{"role": "user", "content": BILLING_LINE}]
    assert CC.normalize(user_first) is user_first


def test_other_adapters_never_normalise() -> None:
    msgs = _history(f"{BILLING_LINE}\nYou are Claude Code.")
    for name in adapter_names():
        if name != "claude_code":
            assert get_adapter(name).normalize(msgs) is msgs
    with pytest.raises(TypeError, match="messages must be a list, got tuple"):
        CC.normalize(tuple(msgs))


def test_with_the_servers_conversion() -> None:
    """Whether ``from_anthropic`` keeps the line (joined into the system message) or drops it,
    the normalised messages are the same."""
    assert BILLING_HEADER_PREFIX == server_messages.BILLING_HEADER_PREFIX
    system = [{"type": "text", "text": BILLING_LINE},
              {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
              {"type": "text", "text": "Env: linux"}]
    turns = [AnthropicMessage(role="user", content=[{"type": "text", "text": "hi"}]),
             AnthropicMessage(role="system", content="agents: general-purpose")]
    out = CC.normalize(server_messages.from_anthropic(system, turns))
    assert out == [{"role": "system", "content": "You are Claude Code.\nEnv: linux"},
                   {"role": "user", "content": "hi"},
                   {"role": "system", "content": "agents: general-purpose"}]
