"""Structured outputs on a scripted engine: which grammar each format puts on the request, how
it combines with tools and reasoning, the echoed format, and the exact 400 bodies of bad
formats in each API's own error shape (refused before the engine, server still healthy).
"""

from __future__ import annotations

import httpx
import pytest

from freetoken.constrain import json_answer_grammar, tool_call_grammar
from freetoken.server import ServerConfig, create_app
from tests.engine.answer_schemas import NESTED, PERSON
from tests.engine.constrained_schemas import TOOLS
from tests.server.srv_fakes import FakeEngine
from tests.server.srv_live import LiveServer

USER = [{"role": "user", "content": "hi"}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
ANT_TOOLS = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
             for t in TOOLS]
RESP_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]
ANSWER = '{"name": "Al", "age": 3, "role": "user", "tags": []}'
CHAT_PERSON = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
STRIN = "failed to compile JSON schema: Invalid type: strin"


class Live:
    """A live server on a scripted engine of ``model_type`` and an httpx client."""

    def __init__(self, model_type: str = "qwen3_next") -> None:
        self.engine = FakeEngine(model_type=model_type)
        self.live = LiveServer(create_app(self.engine, ServerConfig(served_model_name="m",
                                                                    max_output_tokens=64)))
        self.http = httpx.Client(base_url=self.live.base_url, timeout=30)

    def post(self, path: str, body: dict, status: int = 200) -> dict:
        self.engine.push(ANSWER)
        r = self.http.post(path, json=body)
        assert r.status_code == status, r.text
        return r.json()

    def grammar(self, path: str, body: dict):
        self.post(path, body)
        return self.engine.last.request.sampling.grammar

    def close(self) -> None:
        self.http.close()
        self.live.stop()


@pytest.fixture(scope="module")
def live():
    server = Live()
    yield server
    server.close()


def chat(**body) -> tuple[str, dict]:
    return "/v1/chat/completions", {"messages": USER, **NO_THINKING, **body}


def responses(**body) -> tuple[str, dict]:
    return "/v1/responses", {"input": "hi", "reasoning": {"effort": "none"}, **body}


def messages(**body) -> tuple[str, dict]:
    return "/v1/messages", {"max_tokens": 32, "messages": USER, **body}


def person(**kwargs):
    return json_answer_grammar(PERSON, "json", **kwargs)


@pytest.mark.parametrize(("request_", "expected"), [
    (chat(response_format=CHAT_PERSON), person()),
    (chat(response_format={"type": "json_object"}), json_answer_grammar(None, "json")),
    (chat(response_format={"type": "text"}), None),
    (chat(response_format={"type": "json_schema", "json_schema": {"name": "any"}}),
     json_answer_grammar(None, "json")),
    (responses(text={"format": {"type": "json_schema", "name": "p", "schema": PERSON}}),
     person()),
    (responses(text={"format": {"type": "json_object"}}), json_answer_grammar(None, "json")),
    (responses(text={"format": {"type": "text"}}), None),
    (messages(output_config={"format": {"type": "json_schema", "schema": PERSON}}), person()),
    (messages(output_format={"type": "json_schema", "schema": NESTED}),
     json_answer_grammar(NESTED, "json")),
    (messages(output_config={"format": {"type": "json_schema", "schema": PERSON}},
              output_format={"type": "json_schema", "schema": NESTED}), person()),
    (messages(output_config={"effort": "low"}), None),
    (("/v1/completions", {"prompt": "x", "response_format": CHAT_PERSON}), person()),
    (("/v1/completions", {"prompt": "x", "response_format": {"type": "text"}}), None),
], ids=["chat-schema", "chat-object", "chat-text", "chat-no-schema", "resp-schema",
        "resp-object", "resp-text", "ant-config", "ant-older", "ant-config-wins", "ant-none",
        "cmpl-schema", "cmpl-text"])
def test_the_engine_gets_the_format_grammar(live, request_, expected):
    assert live.grammar(*request_) == expected


def test_the_answer_comes_back_as_text_in_each_api(live):
    body = live.post(*chat(response_format=CHAT_PERSON))
    assert body["choices"][0]["message"]["content"] == ANSWER
    fmt = {"type": "json_schema", "name": "p", "schema": PERSON, "strict": True}
    body = live.post(*responses(text={"format": fmt}))
    assert body["output"][0]["content"][0]["text"] == ANSWER
    assert body["text"] == {"format": fmt}
    body = live.post(*messages(output_config={"format": {"type": "json_schema",
                                                         "schema": PERSON}}))
    assert body["content"] == [{"type": "text", "text": ANSWER}]


def test_reasoning_stays_free(live):
    grammar = live.grammar("/v1/chat/completions", {"messages": USER,
                                                    "response_format": CHAT_PERSON})
    assert grammar == person(reasoning=True)
    body = {"max_tokens": 2048, "messages": USER, "thinking": {"type": "enabled",
                                                             "budget_tokens": 1024},
            "output_config": {"format": {"type": "json_schema", "schema": PERSON}}}
    assert live.grammar("/v1/messages", body) == person(reasoning=True)


@pytest.mark.parametrize(("request_", "expected"), [
    (chat(response_format=CHAT_PERSON, tools=TOOLS),
     person(calls=tool_call_grammar(TOOLS, "json"))),
    (chat(response_format=CHAT_PERSON, tools=TOOLS, tool_choice="auto",
          parallel_tool_calls=False),
     person(calls=tool_call_grammar(TOOLS, "json", parallel=False))),
    (chat(response_format=CHAT_PERSON, tools=TOOLS, tool_choice="none"), person()),
    (chat(response_format=CHAT_PERSON, tools=TOOLS, tool_choice="required"),
     tool_call_grammar(TOOLS, "json")),
    (chat(response_format=CHAT_PERSON, tools=TOOLS,
          tool_choice={"type": "function", "function": {"name": "search"}}),
     tool_call_grammar(TOOLS, "json", only="search")),
    (responses(text={"format": {"type": "json_object"}}, tools=RESP_TOOLS),
     json_answer_grammar(None, "json", calls=tool_call_grammar(TOOLS, "json"))),
    (responses(text={"format": {"type": "json_object"}}, tools=RESP_TOOLS,
               tool_choice="required"), tool_call_grammar(TOOLS, "json")),
    (messages(output_config={"format": {"type": "json_schema", "schema": PERSON}},
              tools=ANT_TOOLS), person(calls=tool_call_grammar(TOOLS, "json"))),
    (messages(output_config={"format": {"type": "json_schema", "schema": PERSON}},
              tools=ANT_TOOLS, tool_choice={"type": "tool", "name": "set_zip"}),
     tool_call_grammar(TOOLS, "json", only="set_zip")),
], ids=["chat-auto", "chat-auto-single", "chat-none", "chat-required", "chat-named",
        "resp-auto", "resp-required", "ant-auto", "ant-tool"])
def test_tools_auto_is_the_alternative_and_a_forced_call_wins(live, request_, expected):
    assert live.grammar(*request_) == expected


@pytest.mark.parametrize(("model_type", "form"), [("qwen3_5_moe", "xml"), ("glm4_moe", "glm"),
                                                  ("gpt_oss", "harmony")])
def test_other_templates_frame_the_answer_in_their_form(model_type, form):
    server = Live(model_type)
    try:
        grammar = server.grammar(*chat(response_format=CHAT_PERSON))
        assert (grammar.form, grammar.schema) == (form, person().schema)
    finally:
        server.close()


def oai(message: str, param: str) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param,
                      "code": None}}


def ant(message: str) -> dict:
    return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}


BAD_TYPE = {"type": "object", "properties": {"x": {"type": "strin"}}}
BAD = [
    (chat(response_format={"type": "xml"}),
     oai("response_format.type: Input should be 'text', 'json_object' or 'json_schema'",
         "response_format.type")),
    (chat(response_format={"type": "json_schema"}),
     oai("response_format.json_schema: Field required", "response_format.json_schema")),
    (chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}),
     oai("response_format.json_schema.schema: Input should be a valid dictionary",
         "response_format.json_schema.schema")),
    (chat(response_format={"type": "json_schema",
                           "json_schema": {"name": "x", "schema": BAD_TYPE}}),
     oai(f"response_format.json_schema.schema: the schema cannot be compiled into a grammar: "
         f"{STRIN}", "response_format.json_schema.schema")),
    (chat(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "string", "pattern": "(", "maxLength": 3}}}),
     oai("response_format.json_schema.schema: the schema cannot be compiled into a grammar: "
         "failed to compile JSON schema: regex parse error:\n    (\n    ^\nerror: unclosed group",
         "response_format.json_schema.schema")),
    (responses(text={"format": {"type": "json_schema", "name": "x", "schema": "{}"}}),
     oai("text.format.schema: Input should be a valid dictionary", "text.format.schema")),
    (responses(text={"format": {"type": "json_schema", "name": "x",
                                "schema": {"$ref": "#/$defs/nope"}}}),
     oai("text.format.schema: the schema cannot be compiled into a grammar: failed to compile "
         "JSON schema: Pointer '/$defs/nope' does not exist", "text.format.schema")),
    (responses(text={"format": {"type": "grammar"}}),
     oai("text.format.type: Input should be 'text', 'json_object' or 'json_schema'",
         "text.format.type")),
    (("/v1/completions", {"prompt": "x", "response_format": {"type": "json_schema",
                                                             "json_schema": {"schema": True}}}),
     oai("response_format.json_schema.schema: Input should be a valid dictionary",
         "response_format.json_schema.schema")),
    (messages(output_config={"format": {"type": "json_schema"}}),
     ant("output_config.format.schema: Field required")),
    (messages(output_config={"format": {"type": "text", "schema": {}}}),
     ant("output_config.format.type: Input should be 'json_schema'")),
    (messages(output_format={"type": "json_schema", "schema": BAD_TYPE}),
     ant(f"output_format.schema: the schema cannot be compiled into a grammar: {STRIN}")),
    (messages(output_config={"format": {"type": "json_schema", "schema": [PERSON]}}),
     ant("output_config.format.schema: Input should be a valid dictionary")),
]


@pytest.mark.parametrize(("request_", "expected"), BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_formats_are_400s_in_the_api_shape(live, request_, expected):
    before = len(live.engine.logs)
    path, body = request_
    r = live.http.post(path, json=body)
    assert (r.status_code, r.json()) == (400, expected)
    assert len(live.engine.logs) == before
    assert live.http.get("/health").json() == {"status": "ok"}


def test_a_bad_format_is_refused_even_when_a_call_is_forced(live):
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": BAD_TYPE}}
    path, body = chat(response_format=fmt, tools=TOOLS, tool_choice="required")
    r = live.http.post(path, json=body)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "response_format.json_schema.schema"
