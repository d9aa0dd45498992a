"""The Responses wire checks: a sound stream and object pass, each kind of break is named."""

from __future__ import annotations

import json

import pytest

from .protocol import problems
from .test_protocol_checks import _exchange

MSG = {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
       "content": [{"type": "output_text", "text": "hi", "annotations": []}]}
CALL = {"id": "fc_1", "type": "function_call", "status": "completed", "call_id": "call_1",
        "name": "f", "arguments": '{"a": 1}'}
USAGE = {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7}


def _final(output: list[dict], status: str = "completed") -> dict:
    return {"id": "resp_1", "object": "response", "status": status, "error": None,
            "output": output, "usage": USAGE}


def _events(items: list[dict], final: dict | None = None) -> list[dict]:
    start = {**_final([], "in_progress"), "usage": None}
    out = [{"type": "response.created", "response": start},
           {"type": "response.in_progress", "response": start}]
    for i, item in enumerate(items):
        out += [{"type": "response.output_item.added", "output_index": i, "item": item},
                {"type": "response.output_item.done", "output_index": i, "item": item}]
    return out + [{"type": "response.completed", "response": final or _final(items)}]


def _sse(events: list[dict], numbered: bool = True) -> str:
    return "".join(f"event: {e['type']}\ndata: "
                   f"{json.dumps({**e, 'sequence_number': i} if numbered else e)}\n\n"
                   for i, e in enumerate(events))


def _check(text: str) -> list[str]:
    return problems(_exchange("/v1/responses", {"model": "m", "stream": True}, text))


def test_sound_responses_stream_and_object_pass() -> None:
    assert _check(_sse(_events([MSG, CALL]))) == []
    obj = json.dumps(_final([MSG]))
    assert problems(_exchange("/v1/responses", {"model": "m"}, obj, sse=False)) == []


@pytest.mark.parametrize("text, expected", [
    (_sse(_events([MSG]), numbered=False), "sequence numbers [None, None, None, None, None]... "
     "are not 0, 1, ..."),
    (_sse(_events([MSG])[:-1]), "event order ['response.created', 'response.in_progress'] ... "
                                "['response.output_item.done']"),
    (_sse(_events([MSG], _final([]))), "the final output is not the items added and done"),
    (_sse(_events([{**CALL, "arguments": "{bad"}])),
     "function_call call_1: arguments '{bad' is not JSON"),
    (_sse(_events([MSG], _final([MSG], "incomplete"))), "status 'incomplete', error None"),
    (_sse(_events([{**MSG, "type": "web_search_call"}])), "output item type 'web_search_call'"),
])
def test_broken_responses_streams_are_caught(text: str, expected: str) -> None:
    assert expected in _check(text)


def test_event_name_must_match_the_payload_type() -> None:
    text = _sse(_events([MSG])).replace("event: response.output_item.added", "event: x", 1)
    assert "event 'x' carries type 'response.output_item.added'" in _check(text)
