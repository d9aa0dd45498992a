"""Structured outputs on the real tiny gpt_oss (harmony) engine through the SDKs.

The answer is a ``final`` message whose content is JSON of the schema; with thinking on an
analysis message may come first (reported as reasoning, never in the answer); no harmony token
reaches the answer. Chat, Responses and Messages, streamed and not; with tools under ``auto``
the model either calls a tool or answers in the schema.
"""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
import torch

from freetoken.engine.async_engine import AsyncEngine
from freetoken.models.tiny import cached_tiny
from freetoken.server import ServerConfig, create_app
from tests.engine.answer_schemas import NESTED, PERSON, check_answer
from tests.engine.constrained_schemas import TOOLS, check_call
from tests.server.srv_live import LiveServer

USER = [{"role": "user", "content": "Describe a user account."}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
FORMAT_TOKENS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>",
                 "<|call|>", "<|return|>")


def chat_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


@pytest.fixture(scope="module")
def tiny():
    engine = AsyncEngine.from_pretrained(cached_tiny("gpt_oss"), dtype=torch.float32,
                                         max_model_len=4096)
    live = LiveServer(create_app(engine, ServerConfig(served_model_name="tiny",
                                                      max_output_tokens=256)))
    oai = openai.OpenAI(base_url=live.base_url + "/v1", api_key="unused", max_retries=0,
                        timeout=120)
    ant = anthropic.Anthropic(base_url=live.base_url, api_key="unused", max_retries=0,
                              timeout=120)
    yield oai, ant
    oai.close()
    ant.close()
    live.stop()
    engine.shutdown()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("schema", [PERSON, NESTED], ids=["person", "nested"])
def test_chat_answer_is_json_of_the_schema(tiny, schema, stream):
    oai, _ = tiny
    kwargs = {"model": "tiny", "messages": USER, "response_format": chat_format(schema),
              "temperature": 1.0, "seed": 3, "extra_body": NO_THINKING}
    if stream:
        chunks = list(oai.chat.completions.create(stream=True, **kwargs))
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    else:
        choice = oai.chat.completions.create(**kwargs).choices[0]
        content, finish = choice.message.content, choice.finish_reason
    assert finish == "stop"
    check_answer(content, schema)


def test_chat_with_thinking_may_reason_first(tiny):
    oai, _ = tiny
    choice = oai.chat.completions.create(model="tiny", messages=USER, temperature=0,
                                         response_format=chat_format(PERSON),
                                         max_tokens=200).choices[0]
    content = choice.message.content or ""
    reasoning = getattr(choice.message, "reasoning_content", None) or ""
    assert not any(t in content + reasoning for t in FORMAT_TOKENS)
    if choice.finish_reason == "stop":
        check_answer(content, PERSON)
    else:
        assert choice.finish_reason == "length" and (reasoning or content.startswith("{"))


def test_chat_tools_auto_calls_or_answers(tiny):
    oai, _ = tiny
    kinds = set()
    for seed in range(4):
        choice = oai.chat.completions.create(
            model="tiny", messages=USER, tools=TOOLS, response_format=chat_format(PERSON),
            temperature=1.0, seed=seed, extra_body=NO_THINKING).choices[0]
        kinds.add(choice.finish_reason)
        if choice.finish_reason == "tool_calls":
            (call,) = choice.message.tool_calls
            assert choice.message.content is None
            check_call(call.function.name, call.function.arguments)
        else:
            assert choice.finish_reason == "stop" and choice.message.tool_calls is None
            check_answer(choice.message.content, PERSON)
    assert kinds == {"tool_calls", "stop"}


@pytest.mark.parametrize("stream", [False, True])
def test_responses_and_messages_answers(tiny, stream):
    oai, ant = tiny
    fmt = {"type": "json_schema", "name": "p", "schema": PERSON, "strict": True}
    kwargs = {"model": "tiny", "input": "Describe a user account.", "temperature": 1.0,
              "reasoning": {"effort": "none"}, "extra_body": {"seed": 2},
              "text": {"format": fmt}}
    if stream:
        with oai.responses.stream(**kwargs) as events:
            resp = events.get_final_response()
    else:
        resp = oai.responses.create(**kwargs)
    assert resp.status == "completed"
    check_answer(resp.output_text, PERSON)
    kwargs = {"model": "tiny", "max_tokens": 128, "messages": USER,
              "output_config": {"format": {"type": "json_schema", "schema": NESTED}},
              "extra_body": {"temperature": 1.0, "seed": 2}}
    if stream:
        with ant.messages.stream(**kwargs) as events:
            message = events.get_final_message()
    else:
        message = ant.messages.create(**kwargs)
    assert message.stop_reason == "end_turn" and [b.type for b in message.content] == ["text"]
    check_answer(message.content[0].text, NESTED)
    assert json.loads(message.content[0].text)["kind"] in ("a", "b")
