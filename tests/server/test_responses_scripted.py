"""/v1/responses on the scripted engine (exact text, prompts and event sequences), through the
official openai SDK and raw SSE."""

from __future__ import annotations

import json
import re

import openai
import pytest

from tests.server.srv_live import json_events

BASH = {
    "type": "function",
    "name": "bash",
    "description": "Run a shell command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]},
    "strict": True,
}
BASH_CHAT = {"type": "function", "function": {k: BASH[k] for k in ("name", "description",
                                                                   "parameters")}}
CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
RESP_ID = re.compile(r"^resp_[A-Za-z0-9]{24}$")


@pytest.fixture
def client(srv):
    with openai.OpenAI(base_url=srv.base_url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def n_tokens(srv, text: str) -> int:
    return len(srv.engine.tokenizer.encode(text))


def stream_events(srv, **body) -> list[dict]:
    """The data of every SSE event of a streamed request (event name checked against type)."""
    with srv.http.stream("POST", "/v1/responses", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = json_events(r.iter_lines())
    assert all(name == data["type"] for name, data in events)
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    return [d for _, d in events]


def test_reasoning_and_text_non_streamed(srv, client):
    srv.engine.push("<think>plan it</think>Hello world!", cached_tokens=2)
    resp = client.responses.create(model="any-model", input="hi", instructions="Be brief.")
    assert RESP_ID.match(resp.id) and resp.object == "response" and resp.model == "any-model"
    assert (resp.status, resp.incomplete_details, resp.error) == ("completed", None, None)
    assert [item.type for item in resp.output] == ["reasoning", "message"]
    reasoning, message = resp.output
    assert reasoning.id.startswith("rs_")
    assert [(s.type, s.text) for s in reasoning.summary] == [("summary_text", "plan it")]
    assert (message.role, message.status) == ("assistant", "completed")
    assert [(c.type, c.text, c.annotations) for c in message.content] == [
        ("output_text", "Hello world!", [])]
    assert resp.output_text == "Hello world!"
    assert srv.prompt_text() == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    prompt_len = len(srv.engine.last.request.prompt_ids)
    out = n_tokens(srv, "<think>plan it</think>Hello world!")
    usage = resp.usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (
        prompt_len, out, prompt_len + out)
    assert usage.input_tokens_details.cached_tokens == 2
    assert usage.output_tokens_details.reasoning_tokens == n_tokens(srv, "plan it")
    assert resp.instructions == "Be brief." and resp.tools == [] and resp.tool_choice == "auto"


def test_streamed_event_sequence(srv):
    srv.engine.push("<think>hm</think>Hello world!")
    events = stream_events(srv, input="hi", model="m")
    types = [e["type"] for e in events]
    collapsed = [t for i, t in enumerate(types) if i == 0 or t != types[i - 1]]
    assert collapsed == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta", "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed",
    ]
    start = events[0]["response"]
    assert (start["status"], start["output"], start["usage"]) == ("in_progress", [], None)
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert "".join(deltas) == "Hello world!" and len(deltas) > 2
    final = events[-1]["response"]
    assert final["status"] == "completed"
    assert [i["type"] for i in final["output"]] == ["reasoning", "message"]
    assert final["output"][0]["summary"] == [{"type": "summary_text", "text": "hm"}]
    msg = final["output"][1]
    assert msg["content"] == [{"type": "output_text", "text": "Hello world!", "annotations": []}]
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert added[1]["item"] == {"id": msg["id"], "type": "message", "role": "assistant",
                                 "status": "in_progress", "content": []}
    assert events[-2]["item"] == msg and events[-2]["output_index"] == 1
    assert final["usage"]["output_tokens"] == n_tokens(srv, "<think>hm</think>Hello world!")
    assert srv.http.get(f"/v1/responses/{final['id']}").json() == final


def test_sdk_stream_helper_text(srv, client):
    srv.engine.push("Streaming works, token by token.")
    with client.responses.stream(model="m", input=[{"role": "user", "content": "go"}]) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == "Streaming works, token by token."
    assert final.status == "completed" and len(deltas) > 3
    assert final.usage.output_tokens == n_tokens(srv, "Streaming works, token by token.")


@pytest.mark.parametrize("stream", [False, True])
def test_function_call_then_its_output(srv, client, stream):
    srv.engine.push(CALL)
    first = [{"role": "user", "content": [{"type": "input_text", "text": "list files"}]}]
    kwargs = {"model": "m", "input": first, "tools": [BASH], "tool_choice": "auto"}
    if stream:
        with client.responses.stream(**kwargs) as s:
            kinds = [e.type for e in s]
            resp = s.get_final_response()
        assert kinds.count("response.function_call_arguments.delta") == 1
    else:
        resp = client.responses.create(**kwargs)
    (call,) = resp.output
    assert call.type == "function_call" and call.status == "completed"
    assert re.match(r"^call_[A-Za-z0-9]{24}$", call.call_id) and call.id.startswith("fc_")
    assert (call.name, json.loads(call.arguments)) == ("bash", {"command": "ls"})
    assert resp.tools[0].name == "bash" and resp.output_text == ""
    srv.engine.push("Two files.")
    follow = client.responses.create(
        model="m", tools=[BASH],
        input=[*first, *resp.output,
               {"type": "function_call_output", "call_id": call.call_id, "output": "a.py b.py"}],
    )
    assert follow.output_text == "Two files."
    assert srv.template.calls[-1]["messages"] == [
        {"role": "user", "content": "list files"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": call.call_id, "type": "function",
             "function": {"name": "bash", "arguments": {"command": "ls"}}}]},
        {"role": "tool", "content": "a.py b.py", "tool_call_id": call.call_id},
    ]
    assert srv.template.calls[-1]["tools"] == [BASH_CHAT]


def test_previous_response_id_continues_without_old_instructions(srv, client):
    srv.engine.push("<think>why</think>First.")
    r1 = client.responses.create(model="m", input="one", instructions="Old rules.")
    srv.engine.push("Second.")
    r2 = client.responses.create(model="m", input="two", instructions="New rules.",
                                 previous_response_id=r1.id)
    assert r2.previous_response_id == r1.id and r2.output_text == "Second."
    assert srv.template.calls[-1]["messages"] == [
        {"role": "system", "content": "New rules."},
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "First.", "reasoning_content": "why"},
        {"role": "user", "content": "two"},
    ]
    srv.engine.push("Third.")
    client.responses.create(model="m", input="three", previous_response_id=r2.id)
    assert [m["content"] for m in srv.template.calls[-1]["messages"]] == [
        "one", "First.", "two", "Second.", "three"]


def test_store_false_is_not_kept(srv, client):
    resp = client.responses.create(model="m", input="hi", store=False)
    assert resp.status == "completed"
    r = srv.http.get(f"/v1/responses/{resp.id}")
    assert (r.status_code, r.json()) == (404, {"error": {
        "message": f"Response with id '{resp.id}' not found.", "type": "invalid_request_error",
        "param": None, "code": None}})
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="m", input="again", previous_response_id=resp.id)
    assert info.value.body == {
        "message": f"Previous response with id '{resp.id}' not found.",
        "type": "invalid_request_error", "param": "previous_response_id",
        "code": "previous_response_not_found"}


def test_get_and_delete(srv, client):
    resp = client.responses.create(model="m", input="hi", metadata={"k": "v"})
    got = client.responses.retrieve(resp.id)
    assert got.model_dump() == resp.model_dump() and got.metadata == {"k": "v"}
    r = srv.http.delete(f"/v1/responses/{resp.id}")
    assert (r.status_code, r.json()) == (200, {"id": resp.id, "object": "response",
                                              "deleted": True})
    for method in ("GET", "DELETE"):
        r = srv.http.request(method, f"/v1/responses/{resp.id}")
        assert r.status_code == 404
        assert r.json()["error"]["message"] == f"Response with id '{resp.id}' not found."
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_missing")


@pytest.mark.parametrize("stream", [False, True])
def test_max_output_tokens_is_incomplete(srv, stream):
    srv.engine.push("word ", endless=True)
    body = {"input": "talk", "max_output_tokens": 5}
    if stream:
        events = stream_events(srv, **body)
        assert events[-1]["type"] == "response.incomplete"
        assert "response.completed" not in [e["type"] for e in events]
        final = events[-1]["response"]
    else:
        r = srv.http.post("/v1/responses", json=body)
        assert r.status_code == 200
        final = r.json()
    assert (final["status"], final["incomplete_details"]) == (
        "incomplete", {"reason": "max_output_tokens"})
    assert final["usage"]["output_tokens"] == 5 and final["max_output_tokens"] == 5
    (msg,) = final["output"]
    assert msg["status"] == "incomplete"
    tok = srv.engine.tokenizer
    assert msg["content"][0]["text"] == tok.decode((tok.encode("word ") * 5)[:5])


def test_sdk_stream_of_incomplete_ends_with_its_event(srv, client):
    srv.engine.push("word ", endless=True)
    events = list(client.responses.create(model="m", input="x", max_output_tokens=3,
                                          stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"


def test_failure_mid_stream_ends_with_response_failed(srv):
    srv.engine.push("one two three four five", fail_after=3)
    events = stream_events(srv, input="x")
    assert events[-1]["type"] == "response.failed"
    assert "response.completed" not in [e["type"] for e in events]
    failed = events[-1]["response"]
    assert failed["status"] == "failed"
    assert failed["error"] == {"code": "server_error", "message": "fake engine failure"}
    srv.engine.push("one two three four five", fail_after=3)
    r = srv.http.post("/v1/responses", json={"input": "x"})
    assert (r.status_code, r.json()["error"]["type"]) == (500, "server_error")
    srv.assert_healthy()


def test_harmless_unknown_fields_are_ignored(srv):
    r = srv.http.post("/v1/responses", json={
        "input": "hi", "include": ["reasoning.encrypted_content"], "truncation": "auto",
        "service_tier": "auto", "prompt_cache_key": "k", "user": "u", "parallel_tool_calls": False,
        "reasoning": {"effort": "high", "summary": "auto"}, "text": {"format": {"type": "text"}},
    })
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["user"], body["parallel_tool_calls"], body["reasoning"]) == (
        "u", False, {"effort": "high", "summary": "auto"})
    assert srv.template.calls[-1]["enable_thinking"] is True


def _error(message: str, param: str | None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param,
                      "code": code}}


BAD = [
    ({"input": 5}, _error("input: Input should be a valid string", "input")),
    ({"model": "m"}, _error("input: Field required", "input")),
    ({"input": []}, _error("input: List should have at least 1 item after validation, not 0",
                           "input")),
    ({"input": [{"role": "robot", "content": "x"}]},
     _error("input.0.role: Input should be 'user', 'assistant', 'system' or 'developer'",
            "input.0.role")),
    ({"input": [{"type": "item_reference", "id": "x"}]},
     _error("input.0.type: unsupported input item type 'item_reference'", "input.0.type")),
    ({"input": [{"type": "function_call_output", "output": "x"}]},
     _error("input.0.call_id: Field required", "input.0.call_id")),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
     _error("input.0.content.0: input_image content is not supported by this server "
            "(text-only model)", "input.0.content.0")),
    ({"input": "x", "tools": ["bash"]}, _error("tools.0: Input should be an object", "tools.0")),
    ({"input": "x", "tools": [{"name": "bash"}]}, _error("tools.0.type: Field required",
                                                         "tools.0.type")),
    ({"input": "x", "tools": [{"type": "function"}]},
     _error("tools.0.name: Field required", "tools.0.name")),
    ({"input": "x", "tools": [{"type": "custom"}]},
     _error("tools.0.name: Field required", "tools.0.name")),
    ({"input": "x", "tool_choice": "required"},
     _error("tool_choice: 'required' needs a non-empty tools list", "tool_choice")),
    ({"input": "x", "tools": [BASH], "tool_choice": {"type": "function", "name": "nope"}},
     _error("tool_choice.name: no tool named 'nope' in tools", "tool_choice.name")),
    ({"input": "x", "max_output_tokens": 0},
     _error("max_output_tokens: Input should be greater than or equal to 1",
            "max_output_tokens")),
    ({"input": "x", "text": {"format": {"type": "json_schema", "schema": []}}},
     _error("text.format.schema: Input should be a valid dictionary", "text.format.schema")),
    ({"input": "x", "conversation": "conv_1"},
     _error("conversation: conversations are not supported; use previous_response_id",
            "conversation")),
]


@pytest.mark.parametrize(("body", "expected"), BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input_is_a_400_in_openai_shape(srv, body, expected):
    r = srv.http.post("/v1/responses", json=body)
    assert (r.status_code, r.json()) == (400, expected)
    assert srv.engine.logs == []
    srv.assert_healthy()


def test_sdk_raises_bad_request_with_the_body(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="m", input="x", tool_choice="required")
    assert info.value.status_code == 400
    assert info.value.body == _error(
        "tool_choice: 'required' needs a non-empty tools list", "tool_choice")["error"]


def test_input_items_list_the_whole_context_with_stable_ids(srv, client):
    srv.engine.push("<think>why</think>First.")
    r1 = client.responses.create(model="m", input="one", instructions="Rules.")
    srv.engine.push("Second.")
    r2 = client.responses.create(model="m", previous_response_id=r1.id,
                                 input=[{"role": "user", "content": "two"}])
    body = srv.http.get(f"/v1/responses/{r2.id}/input_items", params={"order": "asc"}).json()
    data = body["data"]
    assert [(d["type"], d.get("role")) for d in data] == [
        ("message", "user"), ("reasoning", None), ("message", "assistant"), ("message", "user")]
    assert data[0]["content"] == [{"type": "input_text", "text": "one"}]
    assert data[3]["content"] == [{"type": "input_text", "text": "two"}]
    assert [d["id"] for d in data[1:3]] == [item.id for item in r1.output]
    assert data[0]["id"].startswith("msg_") and data[3]["id"].startswith("msg_")
    assert (body["object"], body["first_id"], body["last_id"], body["has_more"]) == (
        "list", data[0]["id"], data[3]["id"], False)
    # the first turn's input keeps its id in r1's own list; newest first by default
    first = srv.http.get(f"/v1/responses/{r1.id}/input_items").json()
    assert [d["id"] for d in first["data"]] == [data[0]["id"]]
    newest = [item.id for item in client.responses.input_items.list(r2.id)]
    assert newest == [d["id"] for d in reversed(data)]


def test_input_items_pages_with_limit_and_after(srv, client):
    srv.engine.push("A.")
    r1 = client.responses.create(model="m", input="one")
    srv.engine.push("B.")
    r2 = client.responses.create(model="m", input="two", previous_response_id=r1.id)
    url = f"/v1/responses/{r2.id}/input_items"
    ids = [d["id"] for d in srv.http.get(url, params={"order": "asc"}).json()["data"]]
    assert len(ids) == 3
    page = srv.http.get(url, params={"order": "asc", "limit": 2}).json()
    assert ([d["id"] for d in page["data"]], page["has_more"]) == (ids[:2], True)
    page = srv.http.get(url, params={"order": "asc", "limit": 2, "after": ids[1]}).json()
    assert ([d["id"] for d in page["data"]], page["has_more"], page["first_id"]) == (
        ids[2:], False, ids[2])
    page = srv.http.get(url, params={"after": ids[0]}).json()  # desc: nothing older than it
    assert (page["data"], page["first_id"], page["last_id"]) == ([], None, None)


@pytest.mark.parametrize(("params", "status", "expected"), [
    ({}, 404, _error("Response with id 'resp_missing' not found.", None)),
    ({"limit": 0}, 400, _error("Invalid 'limit': integer below minimum value. Expected a value "
                               ">= 1, but got 0 instead.", "limit")),
    ({"limit": 101}, 400, _error("Invalid 'limit': integer above maximum value. Expected a "
                                 "value <= 100, but got 101 instead.", "limit")),
    ({"order": "up"}, 400, _error("Invalid value: 'up'. Supported values are: 'asc' and "
                                  "'desc'.", "order")),
    ({"after": "msg_x"}, 400, None),
], ids=["unknown-id", "limit-0", "limit-101", "order", "after"])
def test_input_items_errors_in_openai_shape(srv, client, params, status, expected):
    response_id = "resp_missing"
    if status == 400:
        response_id = client.responses.create(model="m", input="hi").id
    r = srv.http.get(f"/v1/responses/{response_id}/input_items", params=params)
    if expected is None:
        expected = _error(f"Invalid 'after': response '{response_id}' has no input item with "
                          "id 'msg_x'.", "after")
    assert (r.status_code, r.json()) == (status, expected)
