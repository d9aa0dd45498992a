"""/v1/responses through the official openai SDK on the real tiny qwen3_next engine.

The random-weight model writes no call by itself: ``tool_choice`` ``required`` / a named function
makes decoding grammar-constrained, so the call's arguments satisfy the tool's schema. Prompts
are checked by their token count against the bundled template's rendering of the conversation
the items stand for; a ``previous_response_id`` continuation reuses the cached common prefix.
"""

from __future__ import annotations

import json

import openai
import pytest
import torch

from freetoken.chat.template import ChatTemplate
from freetoken.engine.async_engine import AsyncEngine
from freetoken.models.tiny import default_model_path
from freetoken.server import ServerConfig, create_app
from tests.engine.constrained_schemas import TOOLS, check_call
from tests.server.srv_live import LiveServer

RESP_TOOLS = [{"type": "function", **t["function"], "strict": True} for t in TOOLS]
NO_THINKING = {"reasoning": {"effort": "none"}}
USER = "What is the weather in Oslo?"


class Tiny:
    """The live server on the tiny engine, an SDK client and the engine's template."""

    def __init__(self) -> None:
        self.engine = AsyncEngine.from_pretrained(default_model_path(), dtype=torch.float32,
                                                  max_model_len=2048)
        app = create_app(self.engine, ServerConfig(served_model_name="tiny",
                                                   max_output_tokens=256))
        self.live = LiveServer(app)
        self.client = openai.OpenAI(base_url=self.live.base_url + "/v1", api_key="unused",
                                    max_retries=0, timeout=120)
        self.template = ChatTemplate.for_model(self.engine.tokenizer.chat_template, "qwen3_next")

    def prompt_ids(self, messages: list[dict], tools: list[dict] | None = None,
                   thinking: bool | None = False) -> list[int]:
        text = self.template.render(messages, tools=tools, add_generation_prompt=True,
                                    enable_thinking=thinking)
        return list(self.engine.tokenizer.encode(text))

    def close(self) -> None:
        self.client.close()
        self.live.stop()
        self.engine.shutdown()


@pytest.fixture(scope="module")
def tiny():
    server = Tiny()
    yield server
    server.close()


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_plain_text_both_modes_agree(tiny):
    kwargs = {"model": "tiny", "input": USER, "instructions": "Be brief.", "temperature": 1.0,
              "extra_body": {"seed": 3}, **NO_THINKING}
    resp = tiny.client.responses.create(**kwargs)
    assert resp.status == "completed" and resp.model == "tiny"
    (message,) = resp.output
    assert message.type == "message" and message.status == "completed"
    assert resp.output_text.strip()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": USER}]
    assert resp.usage.input_tokens == len(tiny.prompt_ids(messages))
    assert resp.usage.output_tokens_details.reasoning_tokens == 0
    with tiny.client.responses.stream(**kwargs) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == resp.output_text  # same seed: same text
    assert final.usage.output_tokens == resp.usage.output_tokens and len(deltas) > 1
    assert final.id != resp.id


@pytest.mark.parametrize("stream", [False, True])
def test_required_yields_one_valid_call(tiny, stream):
    kwargs = {"model": "tiny", "input": USER, "tools": RESP_TOOLS, "tool_choice": "required",
              "parallel_tool_calls": False, "temperature": 0, **NO_THINKING}
    if stream:
        events = list(tiny.client.responses.create(stream=True, **kwargs))
        assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
        assert events[-1].type == "response.completed"
        (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
        resp = events[-1].response
        assert done.arguments == resp.output[0].arguments
    else:
        resp = tiny.client.responses.create(**kwargs)
    assert resp.status == "completed" and resp.tool_choice == "required"
    (call,) = resp.output
    assert call.type == "function_call" and call.call_id.startswith("call_")
    check_call(call.name, call.arguments)


@pytest.mark.parametrize("stream", [False, True])
def test_named_function_yields_that_function(tiny, stream):
    kwargs = {"model": "tiny", "input": USER, "tools": RESP_TOOLS, "temperature": 0.7,
              "tool_choice": {"type": "function", "name": "set_zip"}, **NO_THINKING}
    if stream:
        with tiny.client.responses.stream(**kwargs) as s:
            resp = s.get_final_response()
        (call,) = resp.output
        assert call.parsed_arguments == json.loads(call.arguments)  # strict: the SDK parses it
    else:
        resp = tiny.client.responses.create(**kwargs)
        (call,) = resp.output
    assert call.name == "set_zip"
    check_call("set_zip", call.arguments)


def test_function_call_output_follow_up(tiny):
    kwargs = {"model": "tiny", "tools": RESP_TOOLS, "temperature": 0, **NO_THINKING}
    first = tiny.client.responses.create(input=USER, tool_choice="required",
                                         parallel_tool_calls=False, **kwargs)
    (call,) = first.output
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21C"}
    follow = tiny.client.responses.create(
        input=[{"role": "user", "content": USER}, *first.output, output], max_output_tokens=24,
        **kwargs)
    assert follow.status in ("completed", "incomplete")
    assert all(item.type != "function_call" or item.call_id != call.call_id
               for item in follow.output)
    messages = [
        {"role": "user", "content": USER},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": call.call_id, "type": "function",
             "function": {"name": call.name, "arguments": json.loads(call.arguments)}}]},
        {"role": "tool", "content": "sunny, 21C", "tool_call_id": call.call_id},
    ]
    assert follow.usage.input_tokens == len(tiny.prompt_ids(messages, TOOLS))


def test_previous_response_id_continues_and_reuses_the_prefix(tiny):
    kwargs = {"model": "tiny", "temperature": 0.8, "extra_body": {"seed": 3},
              "max_output_tokens": 12,
              **NO_THINKING}
    first = tiny.client.responses.create(input="list the files", instructions="Be brief.",
                                         **kwargs)
    assert first.output_text
    second = tiny.client.responses.create(input="now the tests", previous_response_id=first.id,
                                          instructions="Be brief.", **kwargs)
    p1 = tiny.prompt_ids([{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": "list the files"}])
    p2 = tiny.prompt_ids([{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": "list the files"},
                          {"role": "assistant", "content": first.output_text},
                          {"role": "user", "content": "now the tests"}])
    assert first.usage.input_tokens == len(p1)
    assert second.usage.input_tokens == len(p2)
    assert second.usage.input_tokens_details.cached_tokens >= _common(p1, p2) > 0
    assert second.previous_response_id == first.id


@pytest.mark.parametrize("stream", [False, True])
def test_max_output_tokens_cuts_reasoning_incomplete(tiny, stream):
    """Thinking is on by default and the random model does not close its think block within
    16 tokens: one reasoning item, cut, and an incomplete response."""
    kwargs = {"model": "tiny", "input": USER, "max_output_tokens": 16, "temperature": 1.0,
              "extra_body": {"seed": 2}}  # seed: a FreeToken extension
    if stream:
        events = list(tiny.client.responses.create(stream=True, **kwargs))
        assert events[-1].type == "response.incomplete"
        resp = events[-1].response
        deltas = [e.delta for e in events if e.type == "response.reasoning_summary_text.delta"]
        assert "".join(deltas) == resp.output[0].summary[0].text
    else:
        resp = tiny.client.responses.create(**kwargs)
    assert (resp.status, resp.incomplete_details.reason) == ("incomplete", "max_output_tokens")
    (reasoning,) = resp.output
    assert reasoning.type == "reasoning" and reasoning.status == "incomplete"
    assert reasoning.summary[0].text.strip()
    assert resp.usage.output_tokens == 16
    assert 0 < resp.usage.output_tokens_details.reasoning_tokens <= 16
    assert resp.usage.input_tokens == len(tiny.prompt_ids([{"role": "user", "content": USER}],
                                                          thinking=None))


def test_retrieve_and_delete(tiny):
    resp = tiny.client.responses.create(model="tiny", input="hi", max_output_tokens=4,
                                        temperature=0, **NO_THINKING)
    assert tiny.client.responses.retrieve(resp.id).model_dump() == resp.model_dump()
    assert tiny.client.responses.delete(resp.id) is None
    with pytest.raises(openai.NotFoundError) as info:
        tiny.client.responses.retrieve(resp.id)
    assert info.value.body == {"message": f"Response with id '{resp.id}' not found.",
                               "type": "invalid_request_error", "param": None, "code": None}
