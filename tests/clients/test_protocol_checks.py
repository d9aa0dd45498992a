"""The wire checks catch each kind of broken response, and pass sound ones; the error-marker grep
flags SDK/transport errors but not the tiny model's noise."""

from __future__ import annotations

import json

import pytest

from .protocol import problems, sse_events
from .runner import API_ERROR_MARKERS, ClientRun, run_problems
from .tap import Exchange


def _exchange(path: str, request: dict, response: str, status: int = 200, sse: bool = True) -> Exchange:
    body = json.dumps(request).encode()
    ex = Exchange(1, "POST", path, {}, body, len(body), 0.0)
    ex.status, ex.complete, ex.finished = status, True, 1.0
    ex.response_headers = {"content-type": "text/event-stream" if sse else "application/json"}
    ex.response_body = response.encode()
    return ex


def _oai(chunks: list[dict], done: bool = True) -> str:
    text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
    return text + ("data: [DONE]\n\n" if done else "")


def _chunk(delta: dict, finish: str | None = None, index: int = 0) -> dict:
    return {"id": "c", "object": "chat.completion.chunk",
            "choices": [{"index": index, "delta": delta, "finish_reason": finish}]}


USAGE = {"id": "c", "object": "chat.completion.chunk", "choices": [],
         "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}
OAI_REQUEST = {"model": "m", "stream": True, "stream_options": {"include_usage": True}}
GOOD_OAI = [_chunk({"role": "assistant", "content": ""}), _chunk({"content": "hi"}), _chunk({}, "stop"), USAGE]


def _ant(events: list[tuple[str, dict]]) -> str:
    return "".join(f"event: {name}\ndata: {json.dumps(dict(type=name, **data))}\n\n" for name, data in events)


START = ("message_start", {"message": {"id": "msg_1", "usage": {"input_tokens": 3}}})
TOOL = [("content_block_start", {"index": 0, "content_block": {"type": "tool_use", "id": "t", "name": "Bash"}}),
        ("content_block_delta", {"index": 0, "delta": {"type": "input_json_delta", "partial_json": '{"command": '}}),
        ("content_block_delta", {"index": 0, "delta": {"type": "input_json_delta", "partial_json": '"ls"}'}}),
        ("content_block_stop", {"index": 0})]
END = [("message_delta", {"delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 4}}),
       ("message_stop", {})]


def test_sse_parser_follows_the_event_stream_rules() -> None:
    text = ": comment\nevent: a\ndata: 1\ndata: 2\n\r\ndata:x\n\ndata: tail"
    assert sse_events(text) == [("a", "1\n2"), (None, "x"), (None, "tail")]


def test_sound_streams_and_objects_pass() -> None:
    assert problems(_exchange("/v1/chat/completions", OAI_REQUEST, _oai(GOOD_OAI))) == []
    tool = [_chunk({"tool_calls": [{"index": 0, "id": "x", "function": {"name": "f", "arguments": '{"a"'}}]}),
            _chunk({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}), _chunk({}, "tool_calls")]
    assert problems(_exchange("/v1/chat/completions", {"stream": True}, _oai(tool))) == []
    assert problems(_exchange("/v1/messages", {"stream": True}, _ant([START, ("ping", {}), *TOOL, *END]))) == []
    obj = {"object": "chat.completion", "usage": {"completion_tokens": 1},
           "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "length"}]}
    assert problems(_exchange("/v1/chat/completions", {}, json.dumps(obj), sse=False)) == []
    msg = {"type": "message", "stop_reason": "end_turn", "content": [{"type": "text", "text": "x"}]}
    assert problems(_exchange("/v1/messages", {}, json.dumps(msg), sse=False)) == []


@pytest.mark.parametrize("chunks, done, expected", [
    (GOOD_OAI, False, "stream does not end with data: [DONE]"),
    (GOOD_OAI[:2] + [_chunk({}, "stop"), _chunk({}, "stop"), USAGE], True, "choice 0: finish_reason sequence"),
    (GOOD_OAI[:2] + [USAGE], True, "no chunk carries a finish_reason"),
    (GOOD_OAI[:3], True, "include_usage asked but the last chunk is not a usage-only chunk"),
    ([_chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{bad"}}]}), _chunk({}, "tool_calls"), USAGE],
     True, "choice 0 tool call 0: arguments '{bad' is not JSON"),
    ([{"error": {"message": "boom"}}, *GOOD_OAI], True, "error chunk: {'message': 'boom'}"),
])
def test_broken_openai_streams_are_caught(chunks: list[dict], done: bool, expected: str) -> None:
    found = problems(_exchange("/v1/chat/completions", OAI_REQUEST, _oai(chunks, done)))
    assert any(p.startswith(expected) for p in found), found


@pytest.mark.parametrize("events, expected", [
    ([START, *TOOL, END[0]], "event order"),
    ([START, *TOOL[:3], *END], "blocks never stopped: [0]"),
    ([START, TOOL[0], ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "x"}}),
      TOOL[3], *END], "text_delta inside a tool_use block"),
    ([START, TOOL[0], ("content_block_delta", {"index": 0, "delta": {"type": "input_json_delta",
                                                                      "partial_json": "{"}}), TOOL[3], *END],
     "tool_use block 0: input JSON '{' does not parse"),
    ([START, *TOOL, ("message_delta", {"delta": {"stop_reason": None}}), END[1]], "message_delta stop_reason"),
    ([START, ("error", {"error": {"type": "overloaded_error"}}), *END], "error event"),
])
def test_broken_anthropic_streams_are_caught(events: list, expected: str) -> None:
    found = problems(_exchange("/v1/messages", {"stream": True}, _ant(events)))
    assert any(p.startswith(expected) for p in found), found


def test_status_and_completeness_are_checked() -> None:
    ex = _exchange("/v1/messages", {}, '{"type":"error"}', status=400, sse=False)
    assert problems(ex) == ['status 400: {"type":"error"}']
    ex.complete = False
    assert problems(ex) == ["response incomplete (status 400)"]
    head = Exchange(1, "HEAD", "/", {}, b"", 0, 0.0, status=404, complete=True)
    assert problems(head) == []
    head.status = 502
    assert problems(head) == ["status 502"]


@pytest.mark.parametrize("text", [
    "API Error: 400 {\"type\":\"error\"}", "litellm.BadRequestError: OpenAIException - x",
    "AI_APICallError: Cannot connect to API", "Error: status code 500", "connect ECONNREFUSED 127.0.0.1:1",
    "HTTP 422 from server", "got 500 Internal Server Error",
])
def test_error_markers_flag_client_errors(text: str) -> None:
    assert API_ERROR_MARKERS.search(text)


@pytest.mark.parametrize("text", [
    "lockingIOError_A.UTF_write error']_soon closed", '"is_error":false,"api_error_status":null',
    "Provider List: https://docs.litellm.ai/docs/providers", "status=ok error=none 200 tokens",
])
def test_error_markers_ignore_model_noise(text: str) -> None:
    assert API_ERROR_MARKERS.search(text) is None


def test_a_response_abandoned_as_the_client_exited_is_not_a_problem() -> None:
    """A stream the client hung up on within a second of its own exit (OpenCode's title request
    when its turn ends) is skipped; one abandoned earlier, or never finished, still counts."""
    done = _exchange("/v1/chat/completions", {"stream": True}, _oai([_chunk({"content": "x"}, "stop")]))
    at_exit, earlier, never = (_exchange("/v1/chat/completions", {"stream": True}, "") for _ in range(3))
    for ex, abandoned in ((at_exit, 99.7), (earlier, 90.0), (never, None)):
        ex.complete, ex.abandoned = False, abandoned
    run = ClientRun("c", 0, "", "", 1.0, [done, at_exit, earlier, never], "", exited=100.0)
    assert run_problems(run) == {
        "POST /v1/chat/completions #2": ["response incomplete (status 200)"],
        "POST /v1/chat/completions #3": ["response incomplete (status 200)"],
    }
