"""Harness sessions on the real engine (embedded tiny qwen3_next, prefix cache on).

Conformance item 1 (issue 5): Claude Code puts a new attribution line
(``x-anthropic-billing-header: …; cch=<nonce>;``) at the top of every request's system prompt; with
its adapter the second turn reuses the whole unchanged prefix, so the reported cache reads are at
least the common token prefix of the two prompts rendered without the line. Without the adapter
(``X-FreeToken-Harness: generic``) the line breaks reuse at the top of the prompt.
"""

from __future__ import annotations

import httpx
import pytest
import torch

from freetoken.chat.template import ChatTemplate
from freetoken.engine.async_engine import AsyncEngine
from freetoken.models.tiny import default_model_path
from freetoken.server import ServerConfig, create_app
from tests.server.srv_live import LiveServer

CLAUDE = {
    "user-agent": "claude-cli/2.1.197 (external, sdk-cli)",
    "x-app": "cli",
    "anthropic-beta": "claude-code-20250219,context-management-2025-06-27",
    "x-claude-code-session-id": "0d5c7f7e-1111-4222-8333-444455556666",
}
SYSTEM_TEXT = "You are an interactive agent that helps users with software engineering tasks."
TOOLS = [{"name": "Bash", "description": "Run a shell command",
          "input_schema": {"type": "object", "properties": {"command": {"type": "string"}},
                           "required": ["command"]}}]


@pytest.fixture(scope="module")
def live():
    path = default_model_path()
    engine = AsyncEngine.from_pretrained(path, dtype=torch.float32, device="cpu")
    app = create_app(engine, ServerConfig(served_model_name="tiny", max_output_tokens=16))
    server = LiveServer(app)
    http = httpx.Client(base_url=server.base_url, timeout=60)
    yield http, engine
    http.close()
    server.stop()
    engine.shutdown()


def _system(nonce: str) -> list[dict]:
    billing = f"x-anthropic-billing-header: cc_version=2.1.197.3fa; cc_entrypoint=sdk-cli; cch={nonce};"
    return [{"type": "text", "text": billing}, {"type": "text", "text": SYSTEM_TEXT,
                                                 "cache_control": {"type": "ephemeral"}}]


def _turns(http: httpx.Client, headers: dict, task: str) -> tuple[dict, dict, list[dict], list[dict]]:
    """Two Claude Code turns; returns both final usages and both message lists."""
    first = [{"role": "user", "content": [{"type": "text", "text": task}]}]
    body = {"model": "tiny", "max_tokens": 12, "system": _system("a1b2c"), "tools": TOOLS,
            "messages": first}
    r1 = http.post("/v1/messages?beta=true", json=body, headers=headers)
    assert r1.status_code == 200, r1.text
    reply = r1.json()
    second = first + [{"role": "assistant", "content": reply["content"] or [{"type": "text", "text": "ok"}]},
                      {"role": "user", "content": [{"type": "text", "text": "now run the tests"}]}]
    body = {**body, "system": _system("9e8d7"), "messages": second}
    r2 = http.post("/v1/messages?beta=true", json=body, headers=headers)
    assert r2.status_code == 200, r2.text
    return reply["usage"], r2.json()["usage"], first, second


def _rendered_ids(engine: AsyncEngine, messages: list[dict]) -> list[int]:
    """Prompt ids of an Anthropic conversation as the server renders it without the billing line."""
    from freetoken.server.anthropic_protocol import AnthropicMessage
    from freetoken.server.messages import from_anthropic

    tpl = ChatTemplate.for_model(engine.tokenizer.chat_template, "qwen3_next")
    tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                               "parameters": t["input_schema"]}} for t in TOOLS]
    msgs = from_anthropic(SYSTEM_TEXT, [AnthropicMessage.model_validate(m) for m in messages])
    text = tpl.render(msgs, tools=tools, add_generation_prompt=True, enable_thinking=False)
    return list(engine.tokenizer.encode(text))


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_claude_code_attribution_line_keeps_the_prefix(live) -> None:
    http, engine = live
    u1, u2, first, second = _turns(http, CLAUDE, "list the python files in this repository")
    p1, p2 = _rendered_ids(engine, first), _rendered_ids(engine, second)
    assert u1["input_tokens"] + u1["cache_read_input_tokens"] == len(p1)
    assert u2["input_tokens"] + u2["cache_read_input_tokens"] == len(p2)
    unchanged = _common(p1, p2)
    assert unchanged > 0.5 * len(p1)
    assert u2["cache_read_input_tokens"] >= unchanged, (u2, unchanged, len(p1), len(p2))
    session = http.get(f"/v1/sessions/claude_code:{CLAUDE['x-claude-code-session-id']}").json()
    assert (session["harness"], session["requests"]) == ("claude_code", 2)
    assert session["reused_tokens"] == u1["cache_read_input_tokens"] + u2["cache_read_input_tokens"]
    assert session["prompt_tokens"] == len(p1) + len(p2)
    assert session["checkpoints_held"] >= 1
    assert session["cached_prefix_tokens"] == len(p2)


def test_without_the_adapter_the_line_breaks_reuse(live) -> None:
    http, _ = live
    headers = {"X-FreeToken-Harness": "generic"}
    _, u2, _, _ = _turns(http, headers, "explain the build system of this project in detail")
    # the first changed token is inside the billing line, a few tokens into the prompt
    assert u2["cache_read_input_tokens"] < 40
