"""/v1/responses with what Codex CLI sends (scripted engine): hosted tool types dropped with a
log line, ``custom`` tools offered as functions and answered as ``custom_tool_call`` items,
Codex's history items (custom calls, local shell calls, web searches, opaque reasoning)
rendered, and its extra fields (``include``, ``store: false``, ``prompt_cache_key``...)
accepted."""

from __future__ import annotations

import json
import logging

from harness_adapters import get_adapter
from tests.server.test_responses_scripted import BASH, BASH_CHAT, stream_events

PATCH_GRAMMAR = 'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF'
APPLY_PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files.",
               "format": {"type": "grammar", "syntax": "lark", "definition": PATCH_GRAMMAR}}
APPLY_PATCH_CHAT = {"type": "function", "function": {
    "name": "apply_patch",
    "description": f"Edit files.\n\nThe input must follow this lark grammar:\n{PATCH_GRAMMAR}",
    "parameters": {"type": "object",
                   "properties": {"input": {"type": "string",
                                            "description": "the raw input of the tool"}},
                   "required": ["input"], "additionalProperties": False}}}
HOSTED = [
    {"type": "namespace", "name": "multi_agent_v1", "description": "Agents.",
     "tools": [{"type": "function", "name": "spawn_agent", "parameters": {}}]},
    {"type": "web_search", "external_web_access": False},
    {"type": "local_shell"},
]
# The fields Codex 0.171 sends besides model/input/tools (captured from a real request).
CODEX_FIELDS = {
    "tool_choice": "auto", "parallel_tool_calls": True, "reasoning": {"summary": "auto"},
    "store": False, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "01a2-thread",
    "client_metadata": {"thread_id": "01a2-thread", "turn_id": "t1"},
    "text": {"verbosity": "low"},
}
PATCH = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch"


def _call(name: str, arguments: dict) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def test_codex_request_is_served_with_hosted_tools_dropped(srv, caplog):
    srv.engine.push("Hi there.")
    body = {"model": "m", "input": [{"type": "message", "role": "user", "id": "msg_1",
                                     "content": [{"type": "input_text", "text": "Say hi."}]}],
            "tools": [BASH, *HOSTED, APPLY_PATCH], **CODEX_FIELDS}
    with caplog.at_level(logging.INFO, logger="freetoken.server"):
        r = srv.http.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    resp = r.json()
    assert resp["status"] == "completed" and resp["store"] is False
    assert resp["output"][0]["content"][0]["text"] == "Hi there."
    assert resp["tools"] == body["tools"]
    assert srv.template.calls[-1]["tools"] == [BASH_CHAT, APPLY_PATCH_CHAT]
    lines = [rec.getMessage() for rec in caplog.records if "not offered" in rec.getMessage()]
    assert lines == ["responses: tools not offered to the model (not runnable as functions): "
                     "namespace multi_agent_v1 (tools.1), web_search (tools.2), "
                     "local_shell (tools.3)"]
    # store: false keeps nothing to continue from
    assert srv.http.get(f"/v1/responses/{resp['id']}").status_code == 404


def test_custom_tool_call_is_a_custom_tool_call_item(srv):
    srv.engine.push(_call("apply_patch", {"input": PATCH}))
    r = srv.http.post("/v1/responses", json={"model": "m", "input": "add a.txt",
                                             "tools": [APPLY_PATCH, BASH]})
    (item,) = r.json()["output"]
    assert item["id"].startswith("ctc_") and item["call_id"].startswith("call_")
    assert {k: item[k] for k in ("type", "status", "name", "input")} == {
        "type": "custom_tool_call", "status": "completed", "name": "apply_patch", "input": PATCH}


def test_custom_tool_call_streams_its_input_events(srv):
    srv.engine.push(_call("apply_patch", {"input": PATCH}))
    events = stream_events(srv, model="m", input="add a.txt", tools=[APPLY_PATCH])
    kinds = [e["type"] for e in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.custom_tool_call_input.delta",
                     "response.custom_tool_call_input.done", "response.output_item.done",
                     "response.completed"]
    added, delta, done, item_done = events[2:6]
    assert added["item"]["input"] == "" and added["item"]["status"] == "in_progress"
    assert delta["delta"] == PATCH and done["input"] == PATCH
    assert item_done["item"]["input"] == PATCH
    assert events[-1]["response"]["output"] == [item_done["item"]]


def test_function_call_of_a_normal_tool_stays_a_function_call(srv):
    srv.engine.push(_call("bash", {"command": "ls"}))
    r = srv.http.post("/v1/responses", json={"model": "m", "input": "ls",
                                             "tools": [APPLY_PATCH, BASH]})
    (item,) = r.json()["output"]
    assert (item["type"], item["name"], json.loads(item["arguments"])) == (
        "function_call", "bash", {"command": "ls"})


def test_codex_history_items_render(srv):
    srv.engine.push("Done.")
    history = [
        {"type": "message", "role": "developer",
         "content": [{"type": "input_text", "text": "Be careful."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": None,
         "encrypted_content": "gAAAA-opaque"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed",
         "action": {"type": "search", "query": "x"}},
        {"type": "custom_tool_call", "call_id": "call_p", "name": "apply_patch", "input": PATCH},
        {"type": "custom_tool_call_output", "call_id": "call_p", "output": "Success."},
        {"type": "local_shell_call", "call_id": "call_s", "status": "completed",
         "action": {"type": "exec", "command": ["ls"]}},
        {"type": "function_call_output", "call_id": "call_s",
         "output": [{"type": "input_text", "text": "a.txt"}]},
    ]
    r = srv.http.post("/v1/responses", json={"model": "m", "input": history,
                                             "tools": [APPLY_PATCH], **CODEX_FIELDS})
    assert r.status_code == 200, r.text
    assert srv.template.calls[-1]["messages"] == [
        {"role": "system", "content": "Be careful."},
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_p", "type": "function",
             "function": {"name": "apply_patch", "arguments": {"input": PATCH}}}]},
        {"role": "tool", "content": "Success.", "tool_call_id": "call_p"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_s", "type": "function",
             "function": {"name": "local_shell",
                          "arguments": {"type": "exec", "command": ["ls"]}}}]},
        {"role": "tool", "content": "a.txt", "tool_call_id": "call_s"},
    ]


def test_codex_requests_bind_to_the_codex_adapter(srv):
    srv.engine.push("Hi.")
    headers = {"originator": "codex_exec", "session-id": "thread-7",
               "user-agent": "codex_exec/0.171.0 (Debian 12.0.0; x86_64) unknown"}
    r = srv.http.post("/v1/responses", headers=headers,
                      json={"model": "m", "input": "Say hi.", **CODEX_FIELDS})
    assert r.status_code == 200, r.text
    got = srv.http.get("/v1/sessions/codex:thread-7").json()
    assert (got["harness"], got["harness_version"], got["requests"]) == ("codex", "0.171.0", 1)
    assert srv.engine.last.request.anchors == get_adapter("codex").anchor_policy()
