"""Hostile input found by probing a live ``freetoken serve``: each case used to end in a 500, a
dropped connection or a stalled event loop; now it gets a 400 in its API's shape (or a 500 that
keeps the connection usable) and the server stays healthy."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from freetoken.server import ServerConfig
from freetoken.server.errors import APIError
from freetoken.server.prompt import encode_text, render_prompt
from tests.server.conftest import MODEL, Served
from tests.server.srv_fakes import ChatMLStandIn, FakeEngine

CHAT = "/v1/chat/completions"
MSGS = "/v1/messages"
CMPL = "/v1/completions"
RESP = "/v1/responses"
USER = '[{"role": "user", "content": "hi"}]'


def oai(message: str, param: str | None = None) -> dict:
    return {
        "error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}
    }


def ant(message: str) -> dict:
    return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}


DEEP = "[" * 50_000 + "]" * 50_000  # under the shared server's 200 kB body limit
TOO_DEEP = "request body is not valid JSON: arrays/objects are nested too deeply"
SURROGATE = "string contains a lone UTF-16 surrogate (\\ud800), which is not valid Unicode"

CASES = [
    # (id, path, raw body, expected body); every status is 400
    (
        "oai-nan",
        CHAT,
        '{"messages": ' + USER + ', "temperature": NaN}',
        oai("request body is not valid JSON: NaN is not a valid JSON value"),
    ),
    (
        "ant-infinity",
        MSGS,
        '{"messages": ' + USER + ', "top_p": -Infinity}',
        ant("request body is not valid JSON: -Infinity is not a valid JSON value"),
    ),
    ("oai-deep", CHAT, '{"messages": ' + DEEP + "}", oai(TOO_DEEP)),
    ("ant-deep", MSGS, '{"messages": ' + DEEP + "}", ant(TOO_DEEP)),
    (
        "oai-surrogate-content",
        CHAT,
        '{"messages": [{"role": "user", "content": "a \\ud800 b"}]}',
        oai(f"messages.0.content: {SURROGATE}", "messages.0.content"),
    ),
    (
        "oai-surrogate-model",  # echoed in the response: would fail to encode after generating
        CHAT,
        '{"model": "\\ud800", "messages": ' + USER + "}",
        oai(f"model: {SURROGATE}", "model"),
    ),
    (
        "oai-surrogate-key",
        CHAT,
        '{"messages": ' + USER + ', "metadata": {"\\ud800": 1}}',
        oai(f"metadata.\\ud800: {SURROGATE}", "metadata.\\ud800"),
    ),
    (
        "cmpl-surrogate-prompt",
        CMPL,
        '{"prompt": ["\\uDC00"]}',
        oai(
            "prompt.0: string contains a lone UTF-16 surrogate (\\udc00), which is not valid "
            "Unicode",
            "prompt.0",
        ),
    ),
    (
        "ant-surrogate-system-block",
        MSGS,
        '{"system": [{"type": "text", "text": "\\ud800"}], "messages": ' + USER + "}",
        ant(f"system.0.text: {SURROGATE}"),
    ),
    (
        "oai-part-not-object",
        CHAT,
        '{"messages": [{"role": "user", "content": ["hi"]}]}',
        oai(
            "messages.0.content.0: Input should be a valid dictionary", "messages.0.content.0"
        ),
    ),
    (
        "ant-block-not-object",
        MSGS,
        '{"messages": [{"role": "user", "content": [1]}]}',
        ant("messages.0.content.0: Input should be a valid dictionary"),
    ),
    (
        "cmpl-mixed-ids",
        CMPL,
        '{"prompt": [1, "a"]}',
        oai(
            "prompt.1: Input should be a valid integer, unable to parse string as an integer",
            "prompt.1",
        ),
    ),
    ("resp-deep", RESP, '{"input": ' + DEEP + "}", oai(TOO_DEEP)),
    (
        "resp-surrogate-item-text",
        RESP,
        '{"input": [{"role": "user", "content": [{"type": "input_text", "text": "\\udfff"}]}]}',
        oai(f"input.0.content.0.text: {SURROGATE.replace('ud800', 'udfff')}",
            "input.0.content.0.text"),
    ),
    (
        "oai-named-choice-without-name",
        CHAT,
        '{"messages": ' + USER + ', "tool_choice": {"type": "function", "function": {}}}',
        oai("tool_choice.function.name: Field required", "tool_choice.function.name"),
    ),
]


@pytest.mark.parametrize(
    ("path", "raw", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_hostile_body_is_a_400_in_api_shape(srv, path, raw, expected):
    r = srv.http.post(path, content=raw.encode(), headers={"content-type": "application/json"})
    assert (r.status_code, r.json()) == (400, expected)
    assert srv.engine.logs == []
    srv.assert_healthy()


def test_surrogate_pair_escape_is_fine(srv):
    # A correctly paired escape is one valid character and must pass.
    r = srv.http.post(
        CHAT,
        content=b'{"messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 200
    assert "\U0001f600" in srv.prompt_text()


class _ExplodingTemplate(ChatMLStandIn):
    """A template with a bug: raises an exception the HTTP layer does not expect."""

    def render(self, messages, tools=None, add_generation_prompt=True, enable_thinking=None):
        raise RuntimeError("template bug")


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length body; (b"" head) if the peer closed."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return 0, {}, b""
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    while len(body) < int(headers["content-length"]):
        body += sock.recv(65536)
    return int(lines[0].split()[1]), headers, body


def _request(method: str, path: str, body: bytes = b"") -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (
            CHAT,
            {
                "error": {
                    "message": "internal server error: RuntimeError: template bug",
                    "type": "server_error",
                    "param": None,
                    "code": None,
                }
            },
        ),
        (
            MSGS,
            {
                "type": "error",
                "error": {
                    "type": "api_error",
                    "message": "internal server error: RuntimeError: template bug",
                },
            },
        ),
    ],
)
def test_bug_is_a_500_and_keeps_the_connection(path, expected):
    # Starlette's ServerErrorMiddleware re-raises after its 500, so uvicorn closed the
    # keep-alive connection and a client's next request on it was reset.
    served = Served(ServerConfig(served_model_name=MODEL), template=_ExplodingTemplate())
    try:
        with socket.create_connection(("127.0.0.1", served.live.port), timeout=10) as sock:
            sock.sendall(_request("POST", path, b'{"max_tokens": 5, "messages": ' + USER.encode() + b"}"))
            status, headers, body = _read_response(sock)
            assert (status, json.loads(body)) == (500, expected)
            assert headers.get("connection") != "close"
            sock.sendall(_request("GET", "/health"))
            status, _, body = _read_response(sock)
            assert (status, json.loads(body or b"null")) == (200, {"status": "ok"})
    finally:
        served.close()


class _DeepTemplate(ChatMLStandIn):
    def render(self, messages, tools=None, add_generation_prompt=True, enable_thinking=None):
        raise RecursionError("maximum recursion depth exceeded while encoding a JSON object")


def test_template_recursion_is_a_400():
    with pytest.raises(APIError) as info:
        render_prompt(_DeepTemplate(), FakeEngine().tokenizer, [{"role": "user"}], None, None)
    assert (info.value.status, info.value.message, info.value.param) == (
        400,
        "chat template error: the conversation or tool schemas are nested too deeply",
        "messages",
    )


def test_encode_text_equals_tokenizer_encode():
    tok = FakeEngine().tokenizer
    text = "<|im_start|>user\nhé 😀 <tool_call>{\"a\": 1}</tool_call>\n\tx<|im_end|>\n" * 3
    assert encode_text(tok, text) == tok.encode(text)


class _GatedTokenizer:
    """The engine's tokenizer, except that encoding a huge text waits until the test opens the
    gate (so "the event loop stays free while a prompt is tokenised" is checked without timing)."""

    def __init__(self, inner) -> None:
        self._inner = inner
        self.entered = threading.Event()
        self.gate = threading.Event()

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def encode(self, text: str):
        if len(text) > 100_000:
            self.entered.set()
            self.gate.wait(60)
        return self._inner.encode(text)


def test_huge_prompt_does_not_freeze_the_event_loop(make_server):
    # Tokenising a 1.2 MB prompt takes seconds; it used to run on the event loop with the GIL
    # held, so /health (and every open stream's pings) waited for it. Here the tokenizer holds
    # the big prompt until /health has answered: a tokenizer called on the event loop would
    # block /health until the gate's 60 s timeout.
    engine = FakeEngine(max_model_len=1000)
    engine.tokenizer = gated = _GatedTokenizer(engine.tokenizer)
    served = make_server(engine=engine)
    big = {"messages": [{"role": "user", "content": "hello world " * 100_000}]}
    result: dict[str, object] = {}

    def send_big() -> None:
        result["big"] = served.http.post(CHAT, json=big, timeout=120)

    worker = threading.Thread(target=send_big)
    worker.start()
    try:
        assert gated.entered.wait(60)  # the big prompt is being tokenised now
        import httpx

        with httpx.Client(base_url=served.base_url, timeout=20) as other:
            r = other.get("/health")
        assert r.status_code == 200
        assert "big" not in result  # answered while the big prompt was still held
    finally:
        gated.gate.set()
        worker.join()
    assert result["big"].json()["error"]["code"] == "context_length_exceeded"


def test_image_in_a_tool_result_becomes_a_placeholder(srv):
    # Claude Code's Read tool answers with an image block when the model opens a picture; a 400
    # would then repeat on every later turn (the block stays in the history).
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}
    body = {
        "max_tokens": 5,
        "messages": [
            {"role": "user", "content": "look"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [{"type": "text", "text": "a.png:"}, image],
                    }
                ],
            },
        ],
    }
    assert srv.http.post(MSGS, json=body).status_code == 200
    tool = srv.template.calls[-1]["messages"][-1]
    assert tool == {
        "role": "tool",
        "content": "a.png:\n[image omitted: this model reads text only]",
        "tool_call_id": "t1",
    }
    oai_body = {
        "messages": [
            {"role": "user", "content": "look"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "read", "arguments": ""}}
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "c1",
                "content": [{"type": "image_url", "image_url": {"url": "data:"}}],
            },
        ]
    }
    assert srv.http.post(CHAT, json=oai_body).status_code == 200
    assert srv.template.calls[-1]["messages"][-1] == {
        "role": "tool",
        "content": "[image_url omitted: this model reads text only]",
        "tool_call_id": "c1",
    }
    # A picture the user sends directly is still refused: the model cannot see it.
    direct = {"max_tokens": 5, "messages": [{"role": "user", "content": [image]}]}
    r = srv.http.post(MSGS, json=direct)
    assert r.status_code == 400


def test_models_list_fills_both_sdks(srv):
    import anthropic
    import openai

    with anthropic.Anthropic(base_url=srv.base_url, api_key="x", max_retries=0) as c:
        page = c.models.list()
        card = c.models.retrieve("claude-anything")
    assert [(m.id, m.type, m.display_name) for m in page.data] == [(MODEL, "model", MODEL)]
    assert page.has_more is False and page.first_id == page.last_id == MODEL
    assert (card.id, card.type, card.max_input_tokens, card.max_tokens) == (
        "claude-anything",
        "model",
        srv.engine.info.max_model_len - 1,
        srv.config.max_output_tokens,
    )
    assert card.created_at is not None and card.created_at.tzinfo is not None
    with openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0) as c:
        assert [(m.id, m.object, m.owned_by) for m in c.models.list().data] == [
            (MODEL, "model", "freetoken")
        ]


def test_completions_default_to_16_tokens(srv):
    # OpenAI's (and vLLM's) Completions default; the server cap (64 here) used to apply.
    srv.engine.push("word " * 100, endless=True)
    r = srv.http.post(CMPL, json={"prompt": "count:"})
    assert r.json()["usage"]["completion_tokens"] == 16
    assert r.json()["choices"][0]["finish_reason"] == "length"
    sp = srv.engine.last.request.sampling
    assert (sp.max_tokens, sp.length_capped) == (16, False)
