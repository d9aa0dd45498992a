"""gpt-oss (harmony) through the live server with its defaults: templates/gpt_oss.jinja and
HarmonyParser, chosen from ``model_type`` ``gpt_oss``, on a FakeEngine that speaks the tiny
gpt_oss tokenizer (harmony tokens are real special tokens) and streams scripted model output.

Both APIs, streamed and not: analysis → ``reasoning_content`` / thinking blocks, a preamble →
content / a text block, a call → ``tool_calls`` / ``tool_use``; the next prompt of a tool loop is
prompt + output + ``<|call|>`` + the result; the requests' reasoning controls become the
``Reasoning:`` level; forced choices get the harmony grammar; malformed output is a 200.
"""

from __future__ import annotations

import json

import pytest

from freetoken.chat.template import ChatTemplate
from freetoken.constrain import tool_call_grammar
from freetoken.parsers import HarmonyParser, OutputParser
from freetoken.server.app import default_parser_factory
from tests.server.srv_conformance import RealServer, ant_tool, oai_tool
from tests.server.srv_fakes import ChatMLStandIn, FakeEngine

BASH = {"command": {"type": "string"}, "timeout": {"type": "integer"}}
USER = [{"role": "user", "content": "list the files"}]
ANALYSIS = "<|channel|>analysis<|message|>The user wants files.<|end|>"
PREAMBLE = "<|start|>assistant<|channel|>commentary<|message|>Let me look.<|end|>"
CALL = ("<|start|>assistant<|channel|>commentary to=functions.bash <|constrain|>json<|message|>"
        '{"command":"ls -la","timeout":"5"}')
FINAL = "<|start|>assistant<|channel|>final<|message|>Two files."
GEN = "<|start|>assistant"


@pytest.fixture(scope="module")
def oss(harmony_tokenizer):
    server = RealServer(engine=FakeEngine(model_type="gpt_oss", tokenizer=harmony_tokenizer))
    yield server
    server.close()


@pytest.fixture
def srv(oss):
    oss.engine.reset()
    yield oss
    oss.engine.reset()


def _level(prompt: str) -> str:
    return prompt.split("\n\nReasoning: ", 1)[1].split("\n", 1)[0]


def test_harmony_parser_is_chosen_for_gpt_oss():
    harmony = ChatTemplate.for_model(None, "gpt_oss")
    assert default_parser_factory("gpt_oss", ChatMLStandIn()) is HarmonyParser
    assert default_parser_factory("custom", harmony) is HarmonyParser  # a harmony checkpoint
    assert default_parser_factory("qwen3_next", ChatTemplate.for_model(None, "qwen3_next")) is (
        OutputParser)


@pytest.mark.parametrize("stream", [False, True])
def test_openai_reasoning_preamble_and_call_then_the_next_prompt_extends(srv, stream):
    script = ANALYSIS + PREAMBLE + CALL
    body = {"messages": USER, "tools": [oai_tool("bash", BASH)], "stream": stream}
    r = srv.chat(body, script)
    assert (r.status, r.finish_reason) == (200, "tool_calls"), r.body
    assert (r.message["reasoning_content"], r.message["content"]) == (
        "The user wants files.", "Let me look.")
    (call,) = r.message["tool_calls"]
    assert call["function"]["name"] == "bash"
    assert json.loads(call["function"]["arguments"]) == {"command": "ls -la", "timeout": 5}
    prompt = srv.prompt()
    assert prompt.startswith("<|start|>system<|message|>You are ChatGPT")
    assert _level(prompt) == "medium"
    assert "type bash = (_: {\ncommand?: string,\ntimeout?: number,\n}) => any;" in prompt
    assert prompt.endswith("<|start|>user<|message|>list the files<|end|>" + GEN)
    result = {"role": "tool", "tool_call_id": call["id"], "content": "a.txt b.txt"}
    history = USER + [r.message, result]
    r = srv.chat({"messages": history, "tools": body["tools"]}, "<|channel|>final<|message|>ok")
    assert (r.status, r.message["content"]) == (200, "ok"), r.body
    assert srv.prompt() == (
        prompt + script.replace('"5"', "5") + "<|call|><|start|>functions.bash to=assistant"
        "<|channel|>commentary<|message|>a.txt b.txt<|end|>" + GEN)


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_thinking_text_and_tool_use_then_the_next_prompt_extends(srv, stream):
    script = ANALYSIS + PREAMBLE + CALL
    body = {"messages": USER, "tools": [ant_tool("bash", BASH)], "stream": stream,
            "thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}}
    r = srv.message(body, script)
    assert (r.status, r.message["stop_reason"]) == (200, "tool_use"), r.body
    thinking, text, use = r.message["content"]
    assert (thinking["type"], thinking["thinking"]) == ("thinking", "The user wants files.")
    assert thinking["signature"]
    assert text == {"type": "text", "text": "Let me look."}
    assert (use["type"], use["name"], use["input"]) == (
        "tool_use", "bash", {"command": "ls -la", "timeout": 5})
    prompt = srv.prompt()
    assert _level(prompt) == "high"
    result = {"type": "tool_result", "tool_use_id": use["id"], "content": "a.txt"}
    history = USER + [{"role": "assistant", "content": r.message["content"]},
                      {"role": "user", "content": [result]}]
    r = srv.message({**body, "messages": history, "stream": False}, "<|channel|>final<|message|>ok")
    assert r.status == 200, r.body
    assert srv.prompt() == (
        prompt + script.replace('"5"', "5") + "<|call|><|start|>functions.bash to=assistant"
        "<|channel|>commentary<|message|>a.txt<|end|>" + GEN)


@pytest.mark.parametrize("stream", [False, True])
def test_final_answer_both_apis(srv, stream):
    r = srv.chat({"messages": USER, "stream": stream}, ANALYSIS + FINAL)
    assert (r.status, r.finish_reason) == (200, "stop"), r.body
    assert (r.message["reasoning_content"], r.message["content"]) == (
        "The user wants files.", "Two files.")
    assert "tool_calls" not in r.message or not r.message["tool_calls"]
    r = srv.message({"messages": USER, "stream": stream}, ANALYSIS + FINAL)
    assert (r.status, r.message["stop_reason"]) == (200, "end_turn"), r.body
    assert [b["type"] for b in r.message["content"]] == ["thinking", "text"]
    assert r.message["content"][1]["text"] == "Two files."
    assert _level(srv.prompt()) == "low"  # no thinking asked: the lowest level


@pytest.mark.parametrize("extra, level", [
    ({}, "medium"),
    ({"reasoning_effort": "high"}, "high"),
    ({"reasoning_effort": "minimal"}, "low"),
    ({"reasoning_effort": "none"}, "low"),
    ({"chat_template_kwargs": {"enable_thinking": False}}, "low"),
    ({"chat_template_kwargs": {"reasoning_effort": "low"}, "reasoning_effort": "high"}, "low"),
])
def test_openai_reasoning_controls(srv, extra, level):
    r = srv.chat({"messages": USER, **extra}, "<|channel|>final<|message|>ok")
    assert r.status == 200, r.body
    assert _level(srv.prompt()) == level


@pytest.mark.parametrize("extra, level", [
    ({}, "low"),
    ({"thinking": {"type": "disabled"}, "output_config": {"effort": "high"}}, "low"),
    ({"thinking": {"type": "adaptive"}}, "medium"),
    ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}}, "high"),
    ({"thinking": {"type": "adaptive"}, "output_config": "not an object"}, "medium"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "low"),
    ({"thinking": {"type": "enabled", "budget_tokens": 10000}}, "medium"),
    ({"thinking": {"type": "enabled", "budget_tokens": 31999}}, "high"),
    ({"thinking": {"type": "enabled", "budget_tokens": 31999},
      "output_config": {"effort": "low"}}, "low"),
])
def test_anthropic_reasoning_controls(srv, extra, level):
    r = srv.message({"messages": USER, "max_tokens": 32000, **extra},
                    "<|channel|>final<|message|>ok")
    assert r.status == 200, r.body
    assert _level(srv.prompt()) == level
    r = srv.http.post("/v1/messages/count_tokens", json={"messages": USER, **extra})
    assert r.status_code == 200, r.text


def test_forced_calls_get_the_harmony_grammar(srv):
    tools = [oai_tool("bash", BASH), oai_tool("read", {"path": {"type": "string"}})]
    srv.chat({"messages": USER, "tools": tools, "tool_choice": "required"}, CALL)
    grammar = srv.engine.last.request.sampling.grammar
    assert grammar == tool_call_grammar(tools, "harmony", reasoning=True)
    srv.chat({"messages": USER, "tools": tools, "tool_choice": "required",
              "chat_template_kwargs": {"enable_thinking": False}}, CALL)
    assert srv.engine.last.request.sampling.grammar.reasoning is False
    named = {"type": "function", "function": {"name": "read"}}
    srv.chat({"messages": USER, "tools": tools, "tool_choice": named}, CALL)
    assert [t.name for t in srv.engine.last.request.sampling.grammar.tools] == ["read"]
    ant = [ant_tool("bash", BASH)]
    srv.message({"messages": USER, "tools": ant, "tool_choice": {"type": "any"}}, CALL)
    grammar = srv.engine.last.request.sampling.grammar
    assert (grammar.form, grammar.reasoning, grammar.parallel) == ("harmony", False, False)


@pytest.mark.parametrize("stream", [False, True])
def test_tool_choice_none_reports_no_call(srv, stream):
    body = {"messages": USER, "tools": [oai_tool("bash", BASH)], "tool_choice": "none",
            "stream": stream}
    r = srv.chat(body, ANALYSIS + CALL)
    assert (r.status, r.finish_reason) == (200, "stop"), r.body
    assert not r.message.get("tool_calls") and not r.message["content"]
    assert r.message["reasoning_content"].endswith('{"command":"ls -la","timeout":"5"}')


@pytest.mark.parametrize("stream", [False, True])
def test_malformed_output_is_a_200_without_format_tokens(srv, stream):
    cut = CALL[: CALL.index('"timeout"')]  # arguments that do not parse
    script = "<|channel|>analysis<|message|>x<|message|>y<|end|>" + cut + "<|channel|>final<|con"
    for post, tool in ((srv.chat, oai_tool), (srv.message, ant_tool)):
        r = post({"messages": USER, "tools": [tool("bash", BASH)], "stream": stream}, script)
        assert r.status == 200, r.body
        assert "<|" not in json.dumps(r.message)
    r = srv.chat({"messages": USER, "tools": [oai_tool("bash", BASH)], "stream": stream}, script)
    assert (r.message["reasoning_content"], r.message["content"]) == ("xy", '{"command":"ls -la",')
    srv.assert_healthy()


def test_output_cut_by_max_tokens_inside_the_analysis(srv):
    r = srv.chat({"messages": USER, "max_tokens": 9}, ANALYSIS + FINAL)
    assert (r.status, r.finish_reason) == (200, "length"), r.body
    assert (r.message["content"], r.message["reasoning_content"]) == ("", "The user w")
