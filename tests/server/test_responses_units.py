"""Responses API pieces without a server: input items → template messages, the response store,
and the output builder's items."""

from __future__ import annotations

import pytest

from freetoken.parsers.events import ReasoningDelta, TextDelta, ToolCallEvent
from freetoken.server.errors import APIError
from freetoken.server.messages import MEDIA_PLACEHOLDER
from freetoken.server.openai_responses_input import input_messages
from freetoken.server.openai_responses_items import OutputBuilder
from freetoken.server.openai_responses_store import ResponseStore, StoredResponse, json_bytes


def call(call_id: str, args: str = '{"a": 1}') -> dict:
    return {"type": "function_call", "call_id": call_id, "name": "f", "arguments": args}


def test_one_turn_of_items_folds_into_one_assistant_message():
    items = [
        {"role": "developer", "content": "rules"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                         {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "s"}],
         "encrypted_content": "opaque"},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "hi", "annotations": []}]},
        call("c1"), call("c2", "not json"),
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2",
         "output": [{"type": "input_text", "text": "two"}, {"type": "input_image"}]},
        {"role": "user", "content": "next"},
    ]
    assert input_messages(items) == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "hi", "reasoning_content": "s", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}},
            {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "not json"}},
        ]},
        {"role": "tool", "content": "one", "tool_call_id": "c1"},
        {"role": "tool", "content": "two\n" + MEDIA_PLACEHOLDER.format(kind="input_image"),
         "tool_call_id": "c2"},
        {"role": "user", "content": "next"},
    ]


def test_reasoning_content_wins_over_summary_and_empty_reasoning_is_dropped():
    items = [
        {"role": "user", "content": "q"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "short"}],
         "content": [{"type": "reasoning_text", "text": "full"}]},
        {"role": "assistant", "content": "a1"},
        {"type": "reasoning", "summary": []},
        {"role": "assistant", "content": "a2"},
    ]
    assert input_messages(items) == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a1", "reasoning_content": "full"},
        {"role": "assistant", "content": "a2"},
    ]


def test_a_turn_continues_across_the_history_boundary():
    out = input_messages([{"role": "user", "content": "q"}, call("c1")], "previous_response_id")
    input_messages([call("c2"), {"type": "function_call_output", "call_id": "c1",
                                 "output": "x"}], "input", out)
    assert [c["id"] for c in out[1]["tool_calls"]] == ["c1", "c2"]
    assert out[2] == {"role": "tool", "content": "x", "tool_call_id": "c1"}


@pytest.mark.parametrize(("items", "message"), [
    (["text"], "input.0: Input should be an object"),
    ([{"type": 3}], "input.0.type: unsupported input item type 3"),
    ([{"role": "user", "content": [{"type": "input_text"}]}],
     "input.0.content.0.text: Input should be a valid string"),
    ([{"role": "user", "content": [{"type": "bogus"}]}],
     "input.0.content.0.type: unsupported content type 'bogus'"),
    ([{"type": "function_call", "call_id": "c", "arguments": "{}"}],
     "input.0.name: Field required"),
])
def test_bad_items_name_their_path(items, message):
    with pytest.raises(APIError) as info:
        input_messages(items)
    assert (info.value.status, info.value.message) == (400, message)


def test_store_drops_the_least_recently_used():
    store = ResponseStore(max_items=2)
    for name in ("a", "b"):
        store.put(name, StoredResponse({"id": name}, ()))
    assert store.get("a").response == {"id": "a"}
    store.put("c", StoredResponse({"id": "c"}, ()))
    assert (store.get("b"), len(store)) == (None, 2)
    assert store.delete("a") and not store.delete("a")
    assert store.get("c").response == {"id": "c"}
    with pytest.raises(ValueError):
        ResponseStore(max_items=0)


def _turn(text: str, size: int) -> dict:
    return {"type": "message", "role": "user", "content": text * size}


def test_store_is_bounded_by_bytes_oldest_first():
    item = _turn("x", 100)
    per_item = json_bytes(item)
    own = json_bytes({"id": "a"})
    store = ResponseStore(max_items=100, max_bytes=3 * (per_item + own))
    for name in ("a", "b", "c"):
        store.put(name, StoredResponse({"id": name}, (_turn("x", 100),)))
    assert (len(store), store.num_bytes) == (3, 3 * (per_item + own))
    assert store.get("a") is not None  # "b" is now the least recently used
    store.put("d", StoredResponse({"id": "d"}, (_turn("x", 100),)))
    assert [n for n in "abcd" if store.get(n) is None] == ["b"]
    assert store.num_bytes == 3 * (per_item + own)
    for name in ("a", "c", "d"):
        store.delete(name)
    assert (len(store), store.num_bytes) == (0, 0)


def test_store_counts_items_shared_by_a_conversation_once():
    first, second = _turn("x", 1000), _turn("y", 1000)
    store = ResponseStore()
    store.put("r1", StoredResponse({"id": "r1", "output": []}, (first,)))
    store.put("r2", StoredResponse({"id": "r2", "output": []}, (first, second)))
    shared = json_bytes(first) + json_bytes(second) + 2 * json_bytes({"id": "r1"})
    assert store.num_bytes == shared
    store.delete("r1")  # r2 still holds the first turn
    assert store.num_bytes == json_bytes(first) + json_bytes(second) + json_bytes({"id": "r2"})
    store.put("r2", StoredResponse({"id": "r2"}, ()))  # replacing releases the old entry
    assert store.num_bytes == json_bytes({"id": "r2"})


def test_a_response_over_the_byte_bound_is_not_kept():
    store = ResponseStore(max_bytes=500)
    store.put("small", StoredResponse({"id": "small"}, ()))
    store.put("big", StoredResponse({"id": "big"}, (_turn("x", 1000),)))
    assert (store.get("big"), store.get("small") is not None) == (None, True)
    assert store.num_bytes == json_bytes({"id": "small"})
    assert (ResponseStore().max_items, ResponseStore().max_bytes) == (256, 256 * 1024 * 1024)
    with pytest.raises(ValueError):
        ResponseStore(max_bytes=0)


def test_builder_items_and_held_back_whitespace():
    builder = OutputBuilder()
    events = []
    for event in (ReasoningDelta("  "), ReasoningDelta("think"), TextDelta("\n\n"),
                  ToolCallEvent(0, "f", '{"a": 1}'), TextDelta("done")):
        events += builder.feed(event)
    events += builder.close("incomplete")
    assert [i["type"] for i in builder.items] == ["reasoning", "function_call", "message"]
    assert builder.items[0]["summary"] == [{"type": "summary_text", "text": "  think"}]
    assert builder.reasoning == "  think"
    assert builder.items[1]["arguments"] == '{"a": 1}'
    assert builder.items[1]["status"] == "completed"
    assert builder.items[2]["status"] == "incomplete"
    assert builder.items[2]["content"][0]["text"] == "done"
    indices = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    assert indices == [0, 1, 2]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done == builder.items
