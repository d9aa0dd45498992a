"""The server wired with its defaults: the real ChatTemplate (templates/<model_type>.jinja) and
the real OutputParser, on a FakeEngine whose script is what a Qwen3-Next model would write."""

from __future__ import annotations

import json

import httpx
import pytest

from freetoken.server import ServerConfig, create_app
from tests.server.srv_fakes import FakeEngine
from tests.server.srv_live import LiveServer, json_events

USER = [{"role": "user", "content": "list the files"}]
BASH_OAI = {
    "type": "function",
    "function": {
        "name": "bash",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}
BASH_ANT = {
    "name": "bash",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
}
SCRIPT = (
    "The user wants files.\n</think>\n\n"
    '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
)


class RealServer:
    def __init__(self, model_type: str) -> None:
        self.engine = FakeEngine(model_type=model_type)
        self.live = LiveServer(
            create_app(self.engine, ServerConfig(served_model_name="tiny", max_output_tokens=256))
        )
        self.http = httpx.Client(base_url=self.live.base_url, timeout=10)

    def prompt(self) -> str:
        return self.engine.tokenizer.decode(self.engine.last.request.prompt_ids)

    def close(self) -> None:
        self.http.close()
        self.live.stop()


@pytest.fixture(scope="module")
def qwen3_next():
    server = RealServer("qwen3_next")
    yield server
    server.close()


def test_openai_reasoning_and_tool_call(qwen3_next):
    qwen3_next.engine.push(SCRIPT)
    r = qwen3_next.http.post(
        "/v1/chat/completions", json={"model": "m", "messages": USER, "tools": [BASH_OAI]}
    )
    assert r.status_code == 200, r.text
    assert qwen3_next.prompt().endswith(
        "<|im_start|>user\nlist the files<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    msg = choice["message"]
    assert (msg["reasoning_content"], msg["content"]) == ("The user wants files.", None)
    (call,) = msg["tool_calls"]
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == (
        "bash",
        {"command": "ls"},
    )


def test_anthropic_stream_thinking_then_tool_use(qwen3_next):
    qwen3_next.engine.push(SCRIPT)
    body = {
        "model": "m",
        "max_tokens": 100,
        "stream": True,
        "messages": USER,
        "tools": [BASH_ANT],
        "thinking": {"type": "adaptive"},
    }
    with qwen3_next.http.stream("POST", "/v1/messages?beta=true", json=body) as r:
        events = json_events(r.iter_lines())
    assert [n for n, _ in events if n != "content_block_delta"] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_stop",
        "content_block_start",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    deltas = [d["delta"] for n, d in events if n == "content_block_delta"]
    assert "".join(d.get("thinking", "") for d in deltas) == "The user wants files."
    assert deltas[-1] == {"type": "input_json_delta", "partial_json": '{"command": "ls"}'}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_anthropic_thinking_off_prefills_empty_think_block(qwen3_next):
    qwen3_next.engine.push("Hello.")
    r = qwen3_next.http.post(
        "/v1/messages", json={"model": "m", "max_tokens": 10, "messages": USER}
    )
    assert qwen3_next.prompt().endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert r.json()["content"] == [{"type": "text", "text": "Hello."}]


def test_real_template_error_is_a_400_and_server_stays_healthy():
    server = RealServer("qwen3_5_moe")
    try:
        bad = USER + [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "bash", "arguments": "not json"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "x"},
        ]
        r = server.http.post("/v1/chat/completions", json={"messages": bad, "tools": [BASH_OAI]})
        assert (r.status_code, r.json()) == (
            400,
            {
                "error": {
                    "message": "chat template qwen3_5_moe: "
                    "Tool call arguments must be a JSON object (function bash).",
                    "type": "invalid_request_error",
                    "param": "messages",
                    "code": None,
                }
            },
        )
        assert server.engine.logs == []
        assert server.http.get("/health").status_code == 200
    finally:
        server.close()
