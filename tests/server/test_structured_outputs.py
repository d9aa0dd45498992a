"""Structured outputs through the official SDKs on the real tiny qwen3_next engine.

The random-weight model writes no JSON by itself: the format makes decoding grammar-constrained,
so the answer parses and satisfies the schema, in the three APIs (chat ``response_format``,
Responses ``text.format``, Messages ``output_config.format`` and the older ``output_format``),
streamed (deltas concatenated) and not. A JSON answer cut by ``max_tokens`` comes back as its
partial text with an honest length finish.
"""

from __future__ import annotations

import json
from typing import Literal

import anthropic
import openai
import pytest
import torch
from pydantic import BaseModel

from freetoken.engine.async_engine import AsyncEngine
from freetoken.models.tiny import default_model_path
from freetoken.server import ServerConfig, create_app
from tests.engine.answer_schemas import SCHEMAS, check_answer
from tests.engine.constrained_schemas import TOOLS, check_call
from tests.server.srv_live import LiveServer

USER = [{"role": "user", "content": "Describe a user account."}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
CASES = [(name, stream) for name in SCHEMAS for stream in (False, True)]
IDS = [f"{name}-{'stream' if stream else 'whole'}" for name, stream in CASES]


class Ticket(BaseModel):
    """A bounded model for the SDKs' parse helpers (enums and booleans only)."""

    kind: Literal["bug", "feature"]
    urgent: bool
    area: Literal["api", "ui", "docs"]


class Tiny:
    """The live server on the tiny engine and both SDK clients."""

    def __init__(self) -> None:
        self.engine = AsyncEngine.from_pretrained(default_model_path(), dtype=torch.float32,
                                                  max_model_len=2048)
        app = create_app(self.engine, ServerConfig(served_model_name="tiny",
                                                   max_output_tokens=256))
        self.live = LiveServer(app)
        self.oai = openai.OpenAI(base_url=self.live.base_url + "/v1", api_key="unused",
                                 max_retries=0, timeout=120)
        self.ant = anthropic.Anthropic(base_url=self.live.base_url, api_key="unused",
                                       max_retries=0, timeout=120)

    def close(self) -> None:
        self.oai.close()
        self.ant.close()
        self.live.stop()
        self.engine.shutdown()


@pytest.fixture(scope="module")
def tiny():
    server = Tiny()
    yield server
    server.close()


def chat_format(name: str) -> dict:
    return {"type": "json_schema",
            "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}


def chat_answer(tiny, stream: bool, **kwargs) -> tuple[str, str]:
    """(content, finish_reason) of a chat completion, streamed deltas concatenated."""
    kwargs = {"model": "tiny", "messages": USER, "extra_body": NO_THINKING, **kwargs}
    if not stream:
        choice = tiny.oai.chat.completions.create(**kwargs).choices[0]
        return choice.message.content, choice.finish_reason
    parts, finish = [], None
    for chunk in tiny.oai.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    return "".join(parts), finish


# ---------------------------------------------------------------- chat completions
@pytest.mark.parametrize(("name", "stream"), CASES, ids=IDS)
def test_chat_json_schema_answer_validates(tiny, name, stream):
    content, finish = chat_answer(tiny, stream, response_format=chat_format(name),
                                  temperature=1.0, seed=5)
    assert finish == "stop"
    check_answer(content, SCHEMAS[name])


def test_chat_stream_matches_whole_answer(tiny):
    kwargs = {"response_format": chat_format("person"), "temperature": 0.8, "seed": 11}
    whole = chat_answer(tiny, False, **kwargs)
    assert chat_answer(tiny, True, **kwargs) == whole
    check_answer(whole[0], SCHEMAS["person"])


@pytest.mark.parametrize("stream", [False, True])
def test_chat_json_object_is_an_object_or_an_honest_cut(tiny, stream):
    content, finish = chat_answer(tiny, stream, response_format={"type": "json_object"},
                                  temperature=0, max_tokens=48)
    assert content.startswith("{")
    if finish == "stop":
        assert isinstance(json.loads(content), dict)
    else:
        assert finish == "length"


def test_chat_text_format_is_unconstrained(tiny):
    content, finish = chat_answer(tiny, False, response_format={"type": "text"}, temperature=0,
                                  max_tokens=24)
    assert finish in ("stop", "length") and not content.startswith("{")


def test_chat_parse_helper_fills_the_model(tiny):
    completion = tiny.oai.chat.completions.parse(
        model="tiny", messages=USER, response_format=Ticket, temperature=1.0, seed=2,
        extra_body=NO_THINKING)
    message = completion.choices[0].message
    assert completion.choices[0].finish_reason == "stop"
    assert isinstance(message.parsed, Ticket)
    assert message.parsed == Ticket.model_validate_json(message.content)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_cut_by_max_tokens_returns_partial_json(tiny, stream):
    content, finish = chat_answer(tiny, stream, response_format=chat_format("nested"),
                                  temperature=0, max_tokens=6)
    assert finish == "length"
    assert content.startswith('{"id": ')
    with pytest.raises(json.JSONDecodeError):
        json.loads(content)


def test_chat_tools_auto_calls_or_answers(tiny):
    kinds = set()
    for seed in range(4):
        choice = tiny.oai.chat.completions.create(
            model="tiny", messages=USER, tools=TOOLS, parallel_tool_calls=False, seed=seed,
            temperature=1.0, response_format=chat_format("person"),
            extra_body=NO_THINKING).choices[0]
        kinds.add(choice.finish_reason)
        if choice.finish_reason == "tool_calls":
            (call,) = choice.message.tool_calls
            check_call(call.function.name, call.function.arguments)
        else:
            assert choice.finish_reason == "stop" and choice.message.tool_calls is None
            check_answer(choice.message.content, SCHEMAS["person"])
    assert kinds == {"tool_calls", "stop"}


@pytest.mark.parametrize("stream", [False, True])
def test_completions_response_format_is_bare_json(tiny, stream):
    kwargs = {"model": "tiny", "prompt": "A user account as JSON:", "max_tokens": 128,
              "temperature": 1.0, "seed": 9,
              "extra_body": {"response_format": chat_format("nested")}}
    if stream:
        chunks = list(tiny.oai.completions.create(stream=True, **kwargs))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    else:
        choice = tiny.oai.completions.create(**kwargs).choices[0]
        text, finish = choice.text, choice.finish_reason
    assert finish == "stop"
    check_answer(text, SCHEMAS["nested"])


# ---------------------------------------------------------------- Responses
def responses_format(name: str) -> dict:
    return {"type": "json_schema", "name": name, "schema": SCHEMAS[name], "strict": True}


@pytest.mark.parametrize(("name", "stream"), CASES, ids=IDS)
def test_responses_json_schema_answer_validates(tiny, name, stream):
    kwargs = {"model": "tiny", "input": "Describe a user account.", "temperature": 1.0,
              "reasoning": {"effort": "none"}, "extra_body": {"seed": 7},
              "text": {"format": responses_format(name)}}
    if stream:
        with tiny.oai.responses.stream(**kwargs) as events:
            text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            resp = events.get_final_response()
        assert text == resp.output_text
    else:
        resp = tiny.oai.responses.create(**kwargs)
    assert resp.status == "completed"
    check_answer(resp.output_text, SCHEMAS[name])
    assert resp.text.format.type == "json_schema" and resp.text.format.name == name


def test_responses_json_object_and_cut(tiny):
    resp = tiny.oai.responses.create(
        model="tiny", input="Describe a user account.", temperature=0, max_output_tokens=6,
        reasoning={"effort": "none"}, text={"format": responses_format("person")})
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert resp.output_text.startswith('{"name": ')
    resp = tiny.oai.responses.create(
        model="tiny", input="Describe a user account.", temperature=0, max_output_tokens=48,
        reasoning={"effort": "none"}, text={"format": {"type": "json_object"}})
    assert resp.output_text.startswith("{") and resp.text.format.type == "json_object"
    if resp.status == "completed":
        assert isinstance(json.loads(resp.output_text), dict)


def test_responses_parse_helper_fills_the_model(tiny):
    resp = tiny.oai.responses.parse(model="tiny", input="File a ticket.", text_format=Ticket,
                                    temperature=1.0, reasoning={"effort": "none"},
                                    extra_body={"seed": 4})
    assert resp.status == "completed"
    assert resp.output_parsed == Ticket.model_validate_json(resp.output_text)


# ---------------------------------------------------------------- Anthropic Messages
def ant_answer(tiny, stream: bool, **kwargs) -> tuple[str, str, list[str]]:
    """(text, stop_reason, block types) of a Messages request, streamed deltas concatenated
    (this SDK takes ``temperature`` only through ``extra_body``)."""
    kwargs = {"model": "tiny", "max_tokens": 128, "messages": USER, **kwargs}
    if not stream:
        message = tiny.ant.messages.create(**kwargs)
        text = "".join(b.text for b in message.content if b.type == "text")
        return text, message.stop_reason, [b.type for b in message.content]
    with tiny.ant.messages.stream(**kwargs) as events:
        text = "".join(e.delta.text for e in events
                       if e.type == "content_block_delta" and e.delta.type == "text_delta")
        message = events.get_final_message()
    return text, message.stop_reason, [b.type for b in message.content]


@pytest.mark.parametrize(("name", "stream"), CASES, ids=IDS)
def test_anthropic_output_config_format_validates(tiny, name, stream):
    fmt = {"type": "json_schema", "schema": SCHEMAS[name]}
    text, stop, blocks = ant_answer(tiny, stream, output_config={"format": fmt},
                                    extra_body={"temperature": 1.0, "seed": 3})
    assert (stop, blocks) == ("end_turn", ["text"])
    check_answer(text, SCHEMAS[name])


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_older_output_format_validates(tiny, stream):
    fmt = {"type": "json_schema", "schema": SCHEMAS["person"]}
    text, stop, _ = ant_answer(tiny, stream,
                               extra_body={"output_format": fmt, "temperature": 0.5, "seed": 8})
    assert stop == "end_turn"
    check_answer(text, SCHEMAS["person"])


def test_anthropic_parse_helper_and_cut(tiny):
    message = tiny.ant.messages.parse(model="tiny", max_tokens=128, messages=USER,
                                      output_format=Ticket,
                                      extra_body={"temperature": 1.0, "seed": 6})
    assert message.stop_reason == "end_turn"
    assert message.parsed_output == Ticket.model_validate_json(message.content[0].text)
    fmt = {"type": "json_schema", "schema": SCHEMAS["nested"]}
    text, stop, blocks = ant_answer(tiny, False, max_tokens=6, output_config={"format": fmt},
                                    extra_body={"temperature": 0})
    assert (stop, blocks) == ("max_tokens", ["text"]) and text.startswith('{"id": ')
