"""Every rejected request gets its API's error shape with an exact body, and the server stays
healthy afterwards."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from tests.server.srv_fakes import FakeEngine

USER = [{"role": "user", "content": "hi"}]
BASH_OAI = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}


def oai(
    message: str,
    param: str | None = None,
    code: str | None = None,
    kind: str = "invalid_request_error",
) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def ant(message: str, kind: str = "invalid_request_error") -> dict:
    return {"type": "error", "error": {"type": kind, "message": message}}


CHAT = "/v1/chat/completions"
MSGS = "/v1/messages"
BAD_JSON = "request body is not valid JSON: Expecting value: line 1 column 1 (char 0)"

CASES = [
    # (id, path, body (str = raw bytes), status, expected JSON)
    ("oai-bad-json", CHAT, "not json", 400, oai(BAD_JSON)),
    ("oai-not-object", CHAT, [], 400, oai("request body must be a JSON object")),
    (
        "oai-missing-messages",
        CHAT,
        {"model": "m"},
        400,
        oai("messages: Field required", "messages"),
    ),
    (
        "oai-empty-messages",
        CHAT,
        {"messages": []},
        400,
        oai("messages: List should have at least 1 item after validation, not 0", "messages"),
    ),
    (
        "oai-bad-role",
        CHAT,
        {"messages": [{"role": "robot", "content": "x"}]},
        400,
        oai(
            "messages.0.role: Input should be 'system', 'developer', 'user', 'assistant' or 'tool'",
            "messages.0.role",
        ),
    ),
    (
        "oai-bad-content-type",
        CHAT,
        {"messages": [{"role": "user", "content": 5}]},
        400,
        oai("messages.0.content: Input should be a valid string", "messages.0.content"),
    ),
    (
        "oai-max-tokens-zero",
        CHAT,
        {"messages": USER, "max_tokens": 0},
        400,
        oai("max_tokens: Input should be greater than or equal to 1", "max_tokens"),
    ),
    (
        "oai-temperature-string",
        CHAT,
        {"messages": USER, "temperature": "hot"},
        400,
        oai(
            "temperature: Input should be a valid number, unable to parse string as a number",
            "temperature",
        ),
    ),
    (
        "oai-image-part",
        CHAT,
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "see"},
                        {"type": "image_url", "image_url": {"url": "data:"}},
                    ],
                }
            ]
        },
        400,
        oai(
            "messages.0.content.1: image_url content is not supported by this server "
            "(text-only model)",
            "messages.0.content.1",
        ),
    ),
    (
        "oai-tool-without-id",
        CHAT,
        {"messages": USER + [{"role": "tool", "content": "x"}]},
        400,
        oai("messages.1.tool_call_id: Field required", "messages.1.tool_call_id"),
    ),
    (
        "oai-unknown-named-tool",
        CHAT,
        {
            "messages": USER,
            "tools": [BASH_OAI],
            "tool_choice": {"type": "function", "function": {"name": "nope"}},
        },
        400,
        oai(
            "tool_choice.function.name: no tool named 'nope' in tools", "tool_choice.function.name"
        ),
    ),
    (
        "oai-required-without-tools",
        CHAT,
        {"messages": USER, "tool_choice": "required"},
        400,
        oai("tool_choice: 'required' needs a non-empty tools list", "tool_choice"),
    ),
    ("oai-n-2", CHAT, {"messages": USER, "n": 2}, 400, oai("n: only n=1 is supported", "n")),
    (
        "oai-empty-stop",
        CHAT,
        {"messages": USER, "stop": ["ok", ""]},
        400,
        oai("stop.1: stop strings must be non-empty", "stop.1"),
    ),
    (
        "oai-unknown-response-format",
        CHAT,
        {"messages": USER, "response_format": {"type": "xml"}},
        400,
        oai("response_format.type: Input should be 'text', 'json_object' or 'json_schema'",
            "response_format.type"),
    ),
    (
        "oai-template-error",
        CHAT,
        {"messages": [{"role": "user", "content": "__template_error__"}]},
        400,
        oai("chat template error: stand-in template refused the conversation", "messages"),
    ),
    (
        "cmpl-echo",
        "/v1/completions",
        {"prompt": "x", "echo": True},
        400,
        oai("echo: echo is not supported", "echo"),
    ),
    (
        "cmpl-empty",
        "/v1/completions",
        {"prompt": ""},
        400,
        oai("prompt: the prompt is empty", "prompt"),
    ),
    (
        "cmpl-bad-id",
        "/v1/completions",
        {"prompt": [1, 99999]},
        400,
        oai("prompt.1: token id 99999 is outside the vocabulary [0, 8218)", "prompt"),
    ),
    (
        "cmpl-two-prompts",
        "/v1/completions",
        {"prompt": ["a", "b"]},
        400,
        oai("prompt: only one prompt per request is supported", "prompt"),
    ),
    ("ant-bad-json", MSGS, "not json", 400, ant(BAD_JSON)),
    (
        "ant-missing-messages",
        MSGS,
        {"model": "m", "max_tokens": 5},
        400,
        ant("messages: Field required"),
    ),
    (
        "ant-max-tokens-string",
        MSGS,
        {"messages": USER, "max_tokens": "abc"},
        400,
        ant("max_tokens: Input should be a valid integer, unable to parse string as an integer"),
    ),
    (
        "ant-image",
        MSGS,
        {
            "max_tokens": 5,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": ""},
                        }
                    ],
                }
            ]
        },
        400,
        ant(
            "messages.0.content.0: image content is not supported by this server (text-only model)"
        ),
    ),
    (
        "ant-unknown-block",
        MSGS,
        {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "video"}]}]},
        400,
        ant("messages.0.content.0.type: unsupported content type 'video'"),
    ),
    (
        "ant-tool-result-no-id",
        MSGS,
        {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]},
        400,
        ant("messages.0.content.0.tool_use_id: Field required"),
    ),
    (
        "ant-text-block-no-text",
        MSGS,
        {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
        400,
        ant("messages.0.content.0.text: Field required"),
    ),
    (
        "ant-bad-system-block",
        MSGS,
        {"max_tokens": 5, "system": [{"type": "image"}], "messages": USER},
        400,
        ant("system.0: image content is not supported by this server (text-only model)"),
    ),
    (
        "ant-server-tool",
        MSGS,
        {"max_tokens": 5, "messages": USER, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        400,
        ant("tools.0.type: server tool 'web_search_20250305' is not supported"),
    ),
    (
        "ant-unknown-tool-choice",
        MSGS,
        {
            "max_tokens": 5,
            "messages": USER,
            "tools": [{"name": "bash", "input_schema": {}}],
            "tool_choice": {"type": "tool", "name": "nope"},
        },
        400,
        ant("tool_choice.name: no tool named 'nope' in tools"),
    ),
    (
        "ant-bad-thinking",
        MSGS,
        {"max_tokens": 5, "messages": USER, "thinking": {"type": "sometimes"}},
        400,
        ant("thinking.type: Input should be 'enabled', 'adaptive' or 'disabled'"),
    ),
    (
        "ant-template-error",
        MSGS,
        {"max_tokens": 5, "messages": [{"role": "user", "content": "__template_error__"}]},
        400,
        ant("chat template error: stand-in template refused the conversation"),
    ),
    (
        "ant-count-bad",
        "/v1/messages/count_tokens?beta=true",
        {"model": "m"},
        400,
        ant("messages: Field required"),
    ),
    ("oai-404", "/v1/nope", {}, 404, oai("Invalid URL (POST /v1/nope)")),
    (
        "ant-404",
        "/v1/messages/batches",
        {},
        404,
        ant("Invalid URL (POST /v1/messages/batches)", "not_found_error"),
    ),
]


@pytest.mark.parametrize(
    ("path", "body", "status", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_request_exact_body_then_healthy(srv, path, body, status, expected):
    content = body if isinstance(body, str) else json.dumps(body)
    r = srv.http.post(path, content=content, headers={"content-type": "application/json"})
    assert (r.status_code, r.json()) == (status, expected)
    assert srv.engine.logs == []  # nothing reached the engine
    srv.assert_healthy()
    assert srv.http.post(CHAT, json={"messages": USER}).status_code == 200


def test_method_not_allowed_and_root(srv):
    r = srv.http.get(CHAT)
    assert (r.status_code, r.json()) == (405, oai("Method Not Allowed (GET /v1/chat/completions)"))
    r = srv.http.get("/v1/nope")
    assert (r.status_code, r.json()) == (404, oai("Invalid URL (GET /v1/nope)"))
    assert srv.http.head("/").status_code == 200
    r = srv.http.get("/")
    assert (r.status_code, r.json()) == (200, {"status": "ok", "name": "freetoken"})
    srv.assert_healthy()


def test_context_length_exceeded(make_server):
    long = "word " * 40
    probe = make_server(engine=FakeEngine(max_model_len=10_000))
    probe.http.post(CHAT, json={"messages": [{"role": "user", "content": long}]})
    n_chat = len(probe.engine.last.request.prompt_ids)
    probe.http.post(MSGS, json={"max_tokens": 5, "messages": [{"role": "user", "content": long}]})
    n_msgs = len(probe.engine.last.request.prompt_ids)

    tight = make_server(engine=FakeEngine(max_model_len=n_chat))  # prompt + 1 > max_model_len
    r = tight.http.post(CHAT, json={"messages": [{"role": "user", "content": long}]})
    assert (r.status_code, r.json()) == (
        400,
        oai(
            f"This model's maximum context length is {n_chat} tokens. However, your prompt "
            f"has {n_chat} tokens, "
            "which leaves no room for output. Please reduce the length of the messages.",
            "messages",
            "context_length_exceeded",
        ),
    )
    r = tight.http.post(
        MSGS, json={"max_tokens": 10, "messages": [{"role": "user", "content": long}]}
    )
    assert (r.status_code, r.json()) == (
        400,
        ant(f"prompt is too long: {n_msgs} tokens > {n_chat - 1} maximum"),
    )
    r = tight.http.post("/v1/completions", json={"prompt": list(range(n_chat))})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert tight.engine.logs == []
    tight.assert_healthy()

    exact = make_server(engine=FakeEngine(max_model_len=n_chat + 1))  # room for exactly one token
    r = exact.http.post(
        CHAT, json={"messages": [{"role": "user", "content": long}], "max_tokens": 10}
    )
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
    sp = exact.engine.last.request.sampling
    assert (sp.max_tokens, sp.length_capped) == (1, True)


def test_body_too_large(make_server):
    served = make_server(max_body_bytes=1000)
    big = {"messages": [{"role": "user", "content": "x" * 2000}]}
    message = "request body is larger than the server limit of 1000 bytes"
    r = served.http.post(CHAT, json=big)
    assert (r.status_code, r.json()) == (413, oai(message))
    r = served.http.post(MSGS, json=big)
    assert (r.status_code, r.json()) == (413, ant(message, "request_too_large"))
    assert served.engine.logs == []
    served.assert_healthy()
    assert served.http.post(CHAT, json={"messages": USER}).status_code == 200


def test_api_key(make_server):
    served = make_server(api_key="sekrit")
    missing = "missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
    r = served.http.post(CHAT, json={"messages": USER})
    assert (r.status_code, r.json()) == (401, oai(missing, code="invalid_api_key"))
    r = served.http.post(CHAT, json={"messages": USER}, headers={"Authorization": "Bearer wrong"})
    assert (r.status_code, r.json()) == (401, oai("invalid API key", code="invalid_api_key"))
    r = served.http.post(MSGS, json={"messages": USER}, headers={"x-api-key": "wrong"})
    assert (r.status_code, r.json()) == (401, ant("invalid API key", "authentication_error"))
    r = served.http.get("/v1/models")
    assert r.status_code == 401
    assert served.engine.logs == []
    served.assert_healthy()  # /health and / need no key
    assert served.http.get("/").status_code == 200

    with openai.OpenAI(
        base_url=served.base_url + "/v1", api_key="sekrit", max_retries=0
    ) as c:  # Bearer
        assert (
            c.chat.completions.create(model="m", messages=USER).choices[0].finish_reason == "stop"
        )
    with anthropic.Anthropic(
        base_url=served.base_url, api_key="sekrit", max_retries=0
    ) as c:  # x-api-key
        assert c.messages.create(model="m", max_tokens=10, messages=USER).stop_reason == "end_turn"
    with anthropic.Anthropic(base_url=served.base_url, api_key="bad", max_retries=0) as c:
        with pytest.raises(anthropic.AuthenticationError):
            c.messages.create(model="m", max_tokens=10, messages=USER)


def test_unhealthy_engine(srv):
    srv.engine.healthy = False
    r = srv.http.get("/health")
    assert (r.status_code, r.json()) == (503, {"status": "unhealthy"})
    message = "the engine is not healthy; try again later"
    r = srv.http.post(CHAT, json={"messages": USER})
    assert (r.status_code, r.json()) == (503, oai(message, kind="server_error"))
    r = srv.http.post(MSGS, json={"max_tokens": 5, "messages": USER})
    assert (r.status_code, r.json()) == (529, ant(message, "overloaded_error"))
    srv.engine.healthy = True
    srv.assert_healthy()


def test_engine_failure_without_streaming_is_500(srv):
    srv.engine.push("a b c d", fail_after=2)
    r = srv.http.post(CHAT, json={"messages": USER})
    assert (r.status_code, r.json()) == (500, oai("fake engine failure", kind="server_error"))
    srv.engine.push("a b c d", fail_after=2)
    r = srv.http.post(MSGS, json={"max_tokens": 5, "messages": USER})
    assert (r.status_code, r.json()) == (500, ant("fake engine failure", "api_error"))
    srv.assert_healthy()


def test_sdk_surfaces_errors(srv):
    with openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0) as c:
        with pytest.raises(openai.BadRequestError) as info:
            c.chat.completions.create(model="m", messages=USER, n=2)
    assert info.value.body == {
        "message": "n: only n=1 is supported",
        "type": "invalid_request_error",
        "param": "n",
        "code": None,
    }
    srv.assert_healthy()
