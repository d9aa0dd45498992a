"""Fixture for the protocol-conformance tests: a live server wired with the real pieces (the
bundled qwen3_next ChatTemplate and the real OutputParser) on a scripted FakeEngine, plus helpers
that post a request in either API, streamed or not, and fold a stream back into a response.

Each helper returns what the client would end up with, so one assertion covers both modes:

* :meth:`RealServer.chat` → the OpenAI ``choices[0]`` (``message``, ``finish_reason``) and the
  stream's raw events;
* :meth:`RealServer.message` → the Anthropic ``content`` blocks, ``stop_reason``,
  ``stop_sequence`` and the raw events.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import httpx
import pytest

from freetoken.server import ServerConfig, create_app
from tests.server.srv_fakes import FakeEngine
from tests.server.srv_live import LiveServer, json_events

CHAT = "/v1/chat/completions"
MSGS = "/v1/messages?beta=true"


def oai_tool(name: str, properties: dict) -> dict:
    """An OpenAI function tool with these JSON-schema ``properties``."""
    schema = {"type": "object", "properties": properties}
    return {"type": "function", "function": {"name": name, "parameters": schema}}


def ant_tool(name: str, properties: dict) -> dict:
    """The Anthropic form of :func:`oai_tool`."""
    return {"name": name, "input_schema": {"type": "object", "properties": properties}}


@dataclass
class Reply:
    """One response as the client sees it.

    Attributes:
        status: HTTP status.
        body: the JSON body (non-streaming or an error), else None.
        events: ``(event name, data)`` of a stream (``[DONE]`` kept as a str), else [].
        message: OpenAI: the assembled ``message`` dict; Anthropic: the assembled ``message``
            object (``content``, ``stop_reason``, ``stop_sequence``, ``usage``).
        finish_reason: OpenAI ``finish_reason`` (None for Anthropic).
    """

    status: int
    body: dict | None = None
    events: list = field(default_factory=list)
    message: dict | None = None
    finish_reason: str | None = None


def fold_openai_stream(events: list) -> tuple[dict, str | None]:
    """The ``message`` and ``finish_reason`` a client rebuilds from chat.completion chunks.

    Tool calls are accumulated by ``index`` (the id/name come once, arguments are concatenated).

    Raises:
        AssertionError: a chunk carries an error or a second choice.
    """
    message: dict = {"role": "assistant", "content": None}
    calls: dict[int, dict] = {}
    finish = None
    for _, data in events:
        if data == "[DONE]":
            continue
        assert "error" not in data, data
        for choice in data["choices"]:
            assert choice["index"] == 0
            delta = choice["delta"]
            for key in ("content", "reasoning_content"):
                if delta.get(key):
                    message[key] = (message.get(key) or "") + delta[key]
            for call in delta.get("tool_calls") or []:
                empty = {"name": None, "arguments": ""}
                slot = calls.setdefault(
                    call["index"], {"id": None, "type": "function", "function": empty}
                )
                if call.get("id"):
                    slot["id"] = call["id"]
                fn = call.get("function") or {}
                if fn.get("name"):
                    slot["function"]["name"] = fn["name"]
                slot["function"]["arguments"] += fn.get("arguments") or ""
            finish = choice["finish_reason"] or finish
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message, finish


def fold_anthropic_stream(events: list) -> dict:
    """The ``message`` a client rebuilds from Anthropic SSE events (blocks by ``index``;
    ``input_json_delta`` fragments joined and parsed at ``content_block_stop``).

    Raises:
        AssertionError: an ``error`` event, a delta/stop for a block that is not open, indices
            that are not contiguous, or an event name that differs from ``data.type``.
    """
    message: dict | None = None
    blocks: list[dict] = []
    open_index: int | None = None
    partial = ""
    for name, data in events:
        assert name == data["type"], (name, data)
        assert name != "error", data
        if name == "message_start":
            message = dict(data["message"])
        elif name == "content_block_start":
            assert open_index is None and data["index"] == len(blocks), data
            blocks.append(dict(data["content_block"]))
            open_index, partial = data["index"], ""
        elif name == "content_block_delta":
            assert data["index"] == open_index, data
            block, delta = blocks[open_index], data["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] += delta["signature"]
            else:
                assert delta["type"] == "input_json_delta", delta
                partial += delta["partial_json"]
        elif name == "content_block_stop":
            assert data["index"] == open_index, data
            if blocks[open_index]["type"] == "tool_use":
                blocks[open_index]["input"] = json.loads(partial) if partial else {}
            open_index = None
        elif name == "message_delta":
            message.update(data["delta"])
            message["usage"] = {**message["usage"], **data["usage"]}
    assert open_index is None
    message["content"] = blocks
    return message


class RealServer:
    """A live server with the real template (``templates/<model_type>.jinja``) and parser on a
    scripted ``FakeEngine``."""

    def __init__(
        self,
        max_model_len: int = 4096,
        max_output_tokens: int = 256,
        model_type: str = "qwen3_next",
        engine: FakeEngine | None = None,
    ) -> None:
        self.engine = engine or FakeEngine(max_model_len=max_model_len, model_type=model_type)
        config = ServerConfig(served_model_name="tiny", max_output_tokens=max_output_tokens)
        self.live = LiveServer(create_app(self.engine, config))
        self.http = httpx.Client(base_url=self.live.base_url, timeout=10)

    def prompt(self) -> str:
        """Prompt text of the engine's last request."""
        return self.engine.tokenizer.decode(self.engine.last.request.prompt_ids)

    def prompt_ids(self) -> tuple[int, ...]:
        """Prompt token ids of the engine's last request."""
        return tuple(self.engine.last.request.prompt_ids)

    def chat(self, body: dict, script: str | None = None) -> Reply:
        """POST ``body`` to /v1/chat/completions (streamed when ``body["stream"]``)."""
        if script is not None:
            self.engine.push(script)
        if not body.get("stream"):
            r = self.http.post(CHAT, json=body)
            if r.status_code != 200:
                return Reply(r.status_code, r.json())
            choice = r.json()["choices"][0]
            return Reply(200, r.json(), [], choice["message"], choice["finish_reason"])
        with self.http.stream("POST", CHAT, json=body) as r:
            if r.status_code != 200:
                r.read()
                return Reply(r.status_code, r.json())
            events = json_events(r.iter_lines())
        message, finish = fold_openai_stream(events)
        return Reply(200, None, events, message, finish)

    def message(self, body: dict, script: str | None = None) -> Reply:
        """POST ``body`` to /v1/messages?beta=true (streamed when ``body["stream"]``)."""
        if script is not None:
            self.engine.push(script)
        body = {"model": "claude-x", "max_tokens": 200, **body}
        if not body.get("stream"):
            r = self.http.post(MSGS, json=body)
            if r.status_code != 200:
                return Reply(r.status_code, r.json())
            return Reply(200, r.json(), [], r.json())
        with self.http.stream("POST", MSGS, json=body) as r:
            if r.status_code != 200:
                r.read()
                return Reply(r.status_code, r.json())
            events = json_events(r.iter_lines())
        return Reply(200, None, events, fold_anthropic_stream(events))

    def assert_healthy(self) -> None:
        """GET /health answers 200 ok."""
        r = self.http.get("/health")
        assert (r.status_code, r.json()) == (200, {"status": "ok"})

    def close(self) -> None:
        self.http.close()
        self.live.stop()


@pytest.fixture(scope="module")
def real():
    """A module-wide :class:`RealServer`; each test starts with an empty script queue."""
    server = RealServer()
    yield server
    server.close()


@pytest.fixture
def srv_real(real):
    """:func:`real` with the engine's scripts and logs cleared around the test."""
    real.engine.reset()
    yield real
    real.engine.reset()
