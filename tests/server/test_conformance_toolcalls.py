"""Conformance: tool calls through the live server (real qwen3_next template and OutputParser),
both APIs, streamed and not.

* Markup the model gets slightly wrong is parsed (or, when beyond repair, returned as the exact
  text), the response ends cleanly, and sending the turn back renders it without stray tags.
* Arguments holding source code (``<``, ``>``, ``</function>``, ``</parameter>``, JSON-looking
  strings) come back byte-exact, typed by the tool's JSON schema, in both call forms.
* Parallel calls get distinct indices / blocks and distinct ids.
"""

from __future__ import annotations

import json

import pytest

from tests.server.srv_conformance import ant_tool, oai_tool, real, srv_real  # noqa: F401

OFF = {"enable_thinking": False}
BASH = {"command": {"type": "string"}, "timeout": {"type": "integer"}}
PREAMBLE = "I will run it.\n"
USER = [{"role": "user", "content": "list the files"}]
MODES = [("openai", False), ("openai", True), ("anthropic", False), ("anthropic", True)]


def ask(server, api: str, stream: bool, script: str, tools: list[dict], messages=USER):
    """One thinking-off request with ``tools`` (given as ``(name, properties)`` pairs)."""
    if api == "openai":
        body = {
            "messages": messages,
            "tools": [oai_tool(n, p) for n, p in tools],
            "stream": stream,
            "chat_template_kwargs": OFF,
        }
        return server.chat(body, script)
    body = {"messages": messages, "tools": [ant_tool(n, p) for n, p in tools], "stream": stream}
    return server.message(body, script)


def calls_of(api: str, reply) -> list[tuple[str, dict]]:
    """``(name, arguments)`` of every tool call in a reply."""
    if api == "openai":
        return [
            (c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in reply.message.get("tool_calls") or []
        ]
    return [(b["name"], b["input"]) for b in reply.message["content"] if b["type"] == "tool_use"]


def text_of(api: str, reply) -> str:
    if api == "openai":
        return reply.message["content"] or ""
    return "".join(b["text"] for b in reply.message["content"] if b["type"] == "text")


def assert_clean_end(api: str, stream: bool, reply, called: bool) -> None:
    """200, the right finish reason, and (streamed) the terminal event last."""
    assert reply.status == 200, reply.body
    if api == "openai":
        assert reply.finish_reason == ("tool_calls" if called else "stop")
        if stream:
            assert reply.events[-1] == (None, "[DONE]")
    else:
        assert reply.message["stop_reason"] == ("tool_use" if called else "end_turn")
        if stream:
            assert [n for n, _ in reply.events[-2:]] == ["message_delta", "message_stop"]


def send_back(server, api: str, reply) -> None:
    """Send the reply back as history with one tool result per call (or a new user turn)."""
    tools = [("bash", BASH)]
    if api == "openai":
        turn = {"role": "assistant", "content": reply.message["content"]}
        if reply.message.get("tool_calls"):
            turn["tool_calls"] = reply.message["tool_calls"]
        tail = [
            {"role": "tool", "tool_call_id": c["id"], "content": "a.txt"}
            for c in reply.message.get("tool_calls") or []
        ] or [{"role": "user", "content": "go on"}]
    else:
        turn = {"role": "assistant", "content": reply.message["content"]}
        results = [
            {"type": "tool_result", "tool_use_id": b["id"], "content": "a.txt"}
            for b in reply.message["content"]
            if b["type"] == "tool_use"
        ]
        tail = [{"role": "user", "content": results or "go on"}]
    r = ask(server, api, False, "ok", tools, USER + [turn] + tail)
    assert r.status == 200, r.body


REPAIRABLE = {
    "duplicated </tool_call>": (
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>\n</tool_call>',
        {"command": "ls"},
    ),
    "duplicated </function>": (
        "<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n</function>\n"
        "</function>\n</tool_call>",
        {"command": "ls"},
    ),
    "surplus closing brace": (
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}}\n</tool_call>',
        {"command": "ls"},
    ),
    "missing closing brace": (
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}\n</tool_call>',
        {"command": "ls"},
    ),
    "undeclared parameter tag": (
        "<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n"
        "<parameter=verbose>\ntrue\n</parameter>\n</function>\n</tool_call>",
        {"command": "ls", "verbose": "true"},
    ),
    "unclosed JSON call at EOS": (
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}',
        {"command": "ls"},
    ),
    "unclosed XML call at EOS": (
        "<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n",
        {"command": "ls"},
    ),
}


@pytest.mark.parametrize("api, stream", MODES)
@pytest.mark.parametrize("case", sorted(REPAIRABLE))
def test_slightly_wrong_markup_is_parsed_and_re_renders_cleanly(srv_real, api, stream, case):
    markup, arguments = REPAIRABLE[case]
    reply = ask(srv_real, api, stream, PREAMBLE + markup, [("bash", BASH)])
    assert_clean_end(api, stream, reply, called=True)
    assert calls_of(api, reply) == [("bash", arguments)]
    assert text_of(api, reply) == "I will run it."

    send_back(srv_real, api, reply)
    args = json.dumps(arguments)
    canonical = '<tool_call>\n{"name": "bash", "arguments": ' + args + "}\n</tool_call>"
    assert srv_real.prompt().endswith(
        "<|im_start|>user\nlist the files<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\nI will run it.\n"
        + canonical
        + "<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\na.txt\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


@pytest.mark.parametrize("api, stream", MODES)
def test_half_a_surrogate_pair_in_call_json_is_replaced_not_a_500(srv_real, api, stream):
    """``json.loads`` makes a lone surrogate of ``\\ud83d``; UTF-8 cannot carry it."""
    markup = (
        '<tool_call>\n{"name": "bash", "arguments": '
        '{"command": "echo \\ud83d cut", "\\udc00": 1}}\n</tool_call>'
    )
    reply = ask(srv_real, api, stream, PREAMBLE + markup, [("bash", BASH)])
    assert_clean_end(api, stream, reply, called=True)
    assert calls_of(api, reply) == [("bash", {"command": "echo \ufffd cut", "\ufffd": 1})]
    assert srv_real.http.get("/health").status_code == 200


UNREPAIRABLE = [
    pytest.param("<tool_call>\n{not json}\n</tool_call>", id="not JSON"),
    pytest.param(
        "<tool_call>\n<function=bash>\n<param=command>\nls\n</param>\n</function>\n</tool_call>",
        id="unknown <param=> tag",
    ),
]


@pytest.mark.parametrize("api, stream", MODES)
@pytest.mark.parametrize("markup", UNREPAIRABLE)
def test_broken_markup_comes_back_as_the_exact_text(srv_real, api, stream, markup):
    reply = ask(srv_real, api, stream, PREAMBLE + markup, [("bash", BASH)])
    assert_clean_end(api, stream, reply, called=False)
    assert calls_of(api, reply) == []
    assert text_of(api, reply) == PREAMBLE + markup

    send_back(srv_real, api, reply)
    assert srv_real.prompt().endswith(
        "<|im_start|>user\nlist the files<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n" + PREAMBLE + markup + "<|im_end|>\n"
        "<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


CODE = (
    "if a < b and c > d:\n"
    '    s = "</function>"\n'
    "    t = '</parameter>'\n"
    "    u = '</tool_call>'\n"
    '    j = \'{"name": "x", "arguments": {"y": 1}}\'\n'
)
WRITE = {
    "path": {"type": "string"},
    "content": {"type": "string"},
    "zip": {"type": "string"},
    "count": {"type": "integer"},
    "force": {"type": "boolean"},
    "opts": {"type": "object"},
    "ratio": {"type": ["number", "null"]},
}
EXPECTED = {
    "path": "src/a<b>.py",
    "content": CODE,
    "zip": "03106",
    "count": 5,
    "force": True,
    "opts": {"a": [1, "<b>"], "s": "</parameter>"},
    "ratio": None,
}
XML_CALL = (
    "<tool_call>\n<function=write>\n"
    "<parameter=path>\nsrc/a<b>.py\n</parameter>\n"
    "<parameter=content>\n" + CODE + "\n</parameter>\n"
    "<parameter=zip>\n03106\n</parameter>\n"
    "<parameter=count>\n5\n</parameter>\n"
    "<parameter=force>\ntrue\n</parameter>\n"
    '<parameter=opts>\n{"a": [1, "<b>"], "s": "</parameter>"}\n</parameter>\n'
    "<parameter=ratio>\nnull\n</parameter>\n"
    "</function>\n</tool_call>"
)
# The JSON form as models get it wrong: scalars and the object written as strings.
JSON_CALL = (
    "<tool_call>\n"
    + json.dumps(
        {
            "name": "write",
            "arguments": {
                "path": "src/a<b>.py",
                "content": CODE,
                "zip": "03106",
                "count": "5",
                "force": "true",
                "opts": json.dumps(EXPECTED["opts"]),
                "ratio": "null",
            },
        }
    )
    + "\n</tool_call>"
)


@pytest.mark.parametrize("api, stream", MODES)
@pytest.mark.parametrize("form", ["xml", "json"])
def test_code_arguments_are_byte_exact_and_typed_by_the_schema(srv_real, api, stream, form):
    script = XML_CALL if form == "xml" else JSON_CALL
    reply = ask(srv_real, api, stream, script, [("write", WRITE)])
    assert_clean_end(api, stream, reply, called=True)
    ((name, arguments),) = calls_of(api, reply)
    assert name == "write"
    assert arguments == EXPECTED
    assert [type(arguments[k]) for k in EXPECTED] == [str, str, str, int, bool, dict, type(None)]


def test_json_form_numbers_for_string_fields_become_strings(srv_real):
    script = (
        '<tool_call>\n{"name": "write", "arguments": '
        '{"zip": 3106, "force": false, "count": 7}}\n</tool_call>'
    )
    reply = ask(srv_real, "openai", False, script, [("write", WRITE)])
    assert calls_of("openai", reply) == [("write", {"zip": "3106", "force": False, "count": 7})]


TWO_CALLS = (
    '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "bash", "arguments": {"command": "pwd"}}\n</tool_call>'
)


def test_parallel_calls_streamed_openai_have_distinct_indices_and_ids(srv_real):
    reply = ask(srv_real, "openai", True, TWO_CALLS, [("bash", BASH)])
    assert_clean_end("openai", True, reply, called=True)
    deltas = [
        call
        for _, data in reply.events
        if data != "[DONE]" and data["choices"]
        for call in data["choices"][0]["delta"].get("tool_calls") or []
    ]
    heads = [d for d in deltas if "id" in d]
    assert [d["index"] for d in heads] == [0, 1]
    assert len({d["id"] for d in heads}) == 2 and all(d["id"].startswith("call_") for d in heads)
    assert {d["index"] for d in deltas} == {0, 1}
    assert calls_of("openai", reply) == [("bash", {"command": "ls"}), ("bash", {"command": "pwd"})]
    non_streamed = ask(srv_real, "openai", False, TWO_CALLS, [("bash", BASH)])
    ids = [c["id"] for c in non_streamed.message["tool_calls"]]
    assert len(set(ids)) == 2


def test_parallel_calls_streamed_anthropic_are_distinct_blocks(srv_real):
    reply = ask(srv_real, "anthropic", True, TWO_CALLS, [("bash", BASH)])
    assert_clean_end("anthropic", True, reply, called=True)
    starts = [d for n, d in reply.events if n == "content_block_start"]
    assert [(s["index"], s["content_block"]["type"]) for s in starts] == [
        (0, "tool_use"),
        (1, "tool_use"),
    ]
    ids = [s["content_block"]["id"] for s in starts]
    assert len(set(ids)) == 2 and all(i.startswith("toolu_") for i in ids)
    json_deltas = [
        (d["index"], d["delta"]["partial_json"])
        for n, d in reply.events
        if n == "content_block_delta"
    ]
    assert json_deltas == [(0, '{"command": "ls"}'), (1, '{"command": "pwd"}')]
    assert [b["id"] for b in reply.message["content"]] == ids
