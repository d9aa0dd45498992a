"""/v1/responses on the real tiny gpt_oss engine (harmony template and parser), through the
openai SDK: ``reasoning.effort`` reaches the template as harmony's ``Reasoning:`` level, forced
calls come back as valid ``function_call`` items, a ``function_call_output`` turn renders, and no
harmony token leaks into text or reasoning."""

from __future__ import annotations

import json

import openai
import pytest
import torch

from freetoken.chat.template import ChatTemplate
from freetoken.engine.async_engine import AsyncEngine
from freetoken.models.tiny import cached_tiny
from freetoken.server import ServerConfig, create_app
from tests.engine.constrained_schemas import TOOLS, check_call
from tests.server.srv_live import LiveServer
from tests.server.test_harmony_tiny import FORMAT_TOKENS

RESP_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]
USER = "What is the weather in Oslo?"


@pytest.fixture(scope="module")
def harmony():
    engine = AsyncEngine.from_pretrained(cached_tiny("gpt_oss"), dtype=torch.float32,
                                         max_model_len=4096)
    live = LiveServer(create_app(engine, ServerConfig(served_model_name="tiny",
                                                      max_output_tokens=256)))
    client = openai.OpenAI(base_url=live.base_url + "/v1", api_key="unused", max_retries=0,
                           timeout=120)
    template = ChatTemplate.for_model(engine.tokenizer.chat_template, "gpt_oss")
    yield engine, client, template
    client.close()
    live.stop()
    engine.shutdown()


def _prompt_len(engine, template, messages, tools, thinking, effort) -> int:
    text = template.render(messages, tools=tools, add_generation_prompt=True,
                           enable_thinking=thinking, reasoning_effort=effort)
    return len(engine.tokenizer.encode(text))


@pytest.mark.parametrize(("effort", "thinking", "level"),
                         [("none", False, "low"), ("high", True, "high")])
def test_effort_reaches_the_template(harmony, effort, thinking, level):
    engine, client, template = harmony
    resp = client.responses.create(model="tiny", input=USER, reasoning={"effort": effort},
                                   max_output_tokens=8, temperature=0)
    messages = [{"role": "user", "content": USER}]
    assert resp.usage.input_tokens == _prompt_len(engine, template, messages, None, thinking,
                                                  level)
    text = template.render(messages, enable_thinking=thinking, reasoning_effort=level)
    assert f"Reasoning: {level}" in text


@pytest.mark.parametrize("stream", [False, True])
def test_required_call_then_its_output(harmony, stream):
    engine, client, template = harmony
    kwargs = {"model": "tiny", "tools": RESP_TOOLS, "temperature": 0,
              "reasoning": {"effort": "none"}}
    if stream:
        events = list(client.responses.create(stream=True, input=USER, tool_choice="required",
                                              **kwargs))
        assert events[-1].type == "response.completed"
        first = events[-1].response
    else:
        first = client.responses.create(input=USER, tool_choice="required", **kwargs)
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and first.status == "completed"
    for call in calls:
        check_call(call.name, call.arguments)
    outputs = [{"type": "function_call_output", "call_id": c.call_id, "output": "sunny"}
               for c in calls]
    follow = client.responses.create(input=[{"role": "user", "content": USER}, *first.output,
                                            *outputs], max_output_tokens=16, **kwargs)
    assert follow.status in ("completed", "incomplete")
    reasoning = "\n".join(s.text for item in first.output if item.type == "reasoning"
                          for s in item.summary)
    assistant = {"role": "assistant", "content": "", "tool_calls": [
        {"id": c.call_id, "type": "function",
         "function": {"name": c.name, "arguments": json.loads(c.arguments)}} for c in calls]}
    if reasoning:
        assistant["reasoning_content"] = reasoning
    messages = [{"role": "user", "content": USER}, assistant,
                *({"role": "tool", "content": "sunny", "tool_call_id": c.call_id} for c in calls)]
    assert follow.usage.input_tokens == _prompt_len(engine, template, messages, TOOLS, False,
                                                    "low")


@pytest.mark.parametrize("stream", [False, True])
def test_unforced_answers_carry_no_format_tokens(harmony, stream):
    """The tiny gpt_oss model often ends its turn at once: then the output is empty, never a
    blank item or harmony markup."""
    _, client, _ = harmony
    for effort in ("none", "high"):
        kwargs = {"model": "tiny", "input": USER, "reasoning": {"effort": effort},
                  "tools": RESP_TOOLS, "temperature": 1.0, "max_output_tokens": 64,
                  "extra_body": {"seed": 11}}
        if stream:
            with client.responses.stream(**kwargs) as s:
                events = list(s)
            resp = events[-1].response
            assert events[-1].type == "response.completed"
        else:
            resp = client.responses.create(**kwargs)
        assert resp.status == "completed" and resp.usage.output_tokens >= 1
        for item in resp.output:
            if item.type == "function_call":
                check_call(item.name, item.arguments)
                continue
            parts = item.summary if item.type == "reasoning" else item.content
            shown = "".join(p.text for p in parts)
            assert shown.strip() and not any(t in shown for t in FORMAT_TOKENS), shown
