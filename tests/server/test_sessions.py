"""Session API and harness binding on the shared FakeEngine server: create / get / list / delete,
explicit and detected sessions, header errors in each API's shape, totals from responses, idle
expiry and the LRU cap (store with an injected clock)."""

from __future__ import annotations

import pytest

from harness_adapters import RequestInfo, get_adapter
from freetoken.prefix.anchors import AnchorPolicy
from freetoken.server.errors import APIError
from freetoken.server.sessions import SessionStore

CLAUDE_HEADERS = {
    "user-agent": "claude-cli/2.1.197 (external, sdk-cli)",
    "x-app": "cli",
    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
    "x-claude-code-session-id": "5b1e0c1e-0000-4000-8000-000000000001",
}


def _anthropic(srv, headers: dict | None = None, **body):
    payload = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], **body}
    return srv.http.post("/v1/messages?beta=true", json=payload, headers=headers or {})


def _openai(srv, headers: dict | None = None, **body):
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}
    return srv.http.post("/v1/chat/completions", json=payload, headers=headers or {})


def _session(srv, session_id: str) -> dict:
    r = srv.http.get(f"/v1/sessions/{session_id}")
    assert r.status_code == 200, r.text
    return r.json()


def test_create_explicit_session_and_use_it(srv) -> None:
    r = srv.http.post("/v1/sessions", json={"harness": "openclaw", "model": "qwen"})
    assert r.status_code == 200, r.text
    made = r.json()
    assert made["id"].startswith("sess_") and made["object"] == "session"
    assert (made["harness"], made["explicit"], made["model"], made["requests"]) == (
        "openclaw", True, "qwen", 0)
    policy = get_adapter("openclaw").anchor_policy()
    assert made["anchors"] == sorted(k.value for k in policy.kinds)
    assert made["anchors_source"] == "harness"
    headers = {"X-FreeToken-Session": made["id"]}
    srv.engine.push("one two")
    first = _openai(srv, headers).json()["usage"]
    srv.engine.push("three")
    second = _openai(srv, headers).json()["usage"]
    assert srv.engine.last.request.anchors == policy
    got = _session(srv, made["id"])
    assert got["requests"] == 2
    assert got["prompt_tokens"] == first["prompt_tokens"] + second["prompt_tokens"]
    assert got["generated_tokens"] == first["completion_tokens"] + second["completion_tokens"]
    cached = first["prompt_tokens_details"]["cached_tokens"] + second["prompt_tokens_details"]["cached_tokens"]
    assert (got["reused_tokens"], got["recomputed_tokens"]) == (cached, got["prompt_tokens"] - cached)
    assert got["checkpoints_held"] is None  # the FakeEngine has no prefix cache


def test_session_anchor_override(srv) -> None:
    r = srv.http.post("/v1/sessions", json={"harness": "claude", "anchors": ["turn_start", "tool_output_start"]})
    assert r.status_code == 200, r.text
    made = r.json()
    assert (made["harness"], made["anchors"], made["anchors_source"]) == (
        "claude_code", ["tool_output_start", "turn_start"], "session")
    srv.engine.push("ok")
    assert _anthropic(srv, {"X-FreeToken-Session": made["id"]}).status_code == 200
    assert srv.engine.last.request.anchors == AnchorPolicy.parse("turn_start,tool_output_start")


@pytest.mark.parametrize("body, message, param", [
    ({"harness": "vim"}, "harness: unknown harness 'vim'", "harness"),
    ({"harness": "opencode", "anchors": "turn_start,bogus"}, "anchors: ", "anchors"),
    ({"harness": "opencode", "anchors": 7}, "anchors: ", "anchors"),
    ({}, "harness: Field required", "harness"),
    ({"harness": "opencode", "colour": "red"}, "colour: Extra inputs are not permitted", "colour"),
])
def test_create_session_bad_body(srv, body, message, param) -> None:
    r = srv.http.post("/v1/sessions", json=body)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["message"].startswith(message), err
    assert (err["type"], err["param"]) == ("invalid_request_error", param)
    srv.assert_healthy()


def test_unknown_session_header_in_each_api_shape(srv) -> None:
    headers = {"X-FreeToken-Session": "sess_nope"}
    r = _openai(srv, headers)
    assert r.status_code == 404
    assert r.json() == {"error": {
        "message": "session 'sess_nope' not found (unknown or expired)",
        "type": "invalid_request_error", "param": "x-freetoken-session", "code": "session_not_found"}}
    r = _anthropic(srv, headers)
    assert r.status_code == 404
    assert r.json() == {"type": "error", "error": {
        "type": "not_found_error", "message": "session 'sess_nope' not found (unknown or expired)"}}
    assert srv.http.get("/v1/sessions/sess_nope").status_code == 404
    assert srv.http.delete("/v1/sessions/sess_nope").status_code == 404
    srv.assert_healthy()


def test_unknown_harness_header(srv) -> None:
    r = _anthropic(srv, {"X-FreeToken-Harness": "emacs"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["message"].startswith("x-freetoken-harness: unknown harness 'emacs'"), err


def test_detected_claude_code_session(srv) -> None:
    srv.engine.push("hello")
    system = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.a1b; cc_entrypoint=sdk-cli; cch=0f3e2;"},
              {"type": "text", "text": "You are Claude Code."}]
    assert _anthropic(srv, CLAUDE_HEADERS, system=system).status_code == 200
    prompt = srv.prompt_text()
    assert "x-anthropic-billing-header" not in prompt and "You are Claude Code." in prompt
    sid = "claude_code:" + CLAUDE_HEADERS["x-claude-code-session-id"]
    got = _session(srv, sid)
    assert (got["harness"], got["harness_version"], got["explicit"], got["requests"]) == (
        "claude_code", "2.1.197", False, 1)
    listed = srv.http.get("/v1/sessions").json()
    assert listed["object"] == "list" and listed["data"][0]["id"] == sid


def test_generic_clients_keep_the_server_policy(srv) -> None:
    srv.engine.push("x")
    assert _openai(srv, {"User-Agent": "curl/8.5"}).status_code == 200
    assert srv.engine.last.request.anchors is None
    got = _session(srv, "generic:default")
    assert (got["anchors"], got["anchors_source"]) == (None, "server")


def test_forced_harness_header(srv) -> None:
    srv.engine.push("x")
    assert _openai(srv, {"X-FreeToken-Harness": "mini-swe-agent"}).status_code == 200
    assert srv.engine.last.request.anchors == get_adapter("mini_swe_agent").anchor_policy()
    assert _session(srv, "mini_swe_agent:default")["harness"] == "mini_swe_agent"


def test_delete_session(srv) -> None:
    made = srv.http.post("/v1/sessions", json={"harness": "swe-agent"}).json()
    r = srv.http.delete(f"/v1/sessions/{made['id']}")
    assert r.json() == {"id": made["id"], "object": "session.deleted", "deleted": True}
    assert srv.http.get(f"/v1/sessions/{made['id']}").status_code == 404


def test_openapi_documents_the_session_api(srv) -> None:
    spec = srv.http.get("/openapi.json").json()
    assert {"post", "get"} <= set(spec["paths"]["/v1/sessions"])
    assert {"get", "delete"} <= set(spec["paths"]["/v1/sessions/{session_id}"])
    schema = spec["paths"]["/v1/sessions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert schema["required"] == ["harness"]


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _info(**headers: str) -> RequestInfo:
    return RequestInfo(api="openai", path="/v1/chat/completions", headers=headers, body={"model": "m"})


def test_store_idle_expiry_and_lru_cap() -> None:
    clock = _Clock()
    store = SessionStore(idle_timeout_s=60, max_sessions=2, clock=clock)
    a = store.create(get_adapter("opencode"))
    clock.now += 30
    b = store.bind(_info(**{"x-freetoken-harness": "openclaw"})).session
    clock.now += 31  # a idle 61 s, b 31 s
    assert [s.id for s in store.list()] == [b.id]
    with pytest.raises(APIError) as err:
        store.get(a.id)
    assert err.value.status == 404
    c = store.create(get_adapter("generic"))
    d = store.create(get_adapter("generic"))
    assert [s.id for s in store.list()] == [d.id, c.id]  # b dropped by the cap (least recently used)
    store.record(c, (1, 2, 3), prompt_tokens=3, cached_tokens=2, completion_tokens=5)
    assert [s.id for s in store.list()] == [c.id, d.id]
    assert (c.requests, c.reused_tokens, c.recomputed_tokens, c.generated_tokens) == (1, 2, 1, 5)


def test_store_rejects_bad_limits() -> None:
    with pytest.raises(ValueError, match="idle_timeout_s must be > 0"):
        SessionStore(idle_timeout_s=0)
    with pytest.raises(ValueError, match="max_sessions must be >= 1"):
        SessionStore(max_sessions=0)


def test_metrics_per_harness(srv) -> None:
    before = srv.http.get("/metrics").text
    srv.engine.push("x")
    r = _openai(srv, {"X-FreeToken-Harness": "swe_agent"})
    usage = r.json()["usage"]
    text = srv.http.get("/metrics").text

    def value(page: str, name: str) -> int:
        line = next((ln for ln in page.splitlines() if ln.startswith(f'{name}{{harness="swe_agent"}} ')), None)
        return int(line.split()[-1]) if line else 0

    assert value(text, "freetoken_harness_requests_total") == value(before, "freetoken_harness_requests_total") + 1
    recomputed = usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"]
    assert value(text, "freetoken_harness_prompt_tokens_recomputed_total") == value(
        before, "freetoken_harness_prompt_tokens_recomputed_total") + recomputed
    assert value(text, "freetoken_sessions") >= 1
    assert "# TYPE freetoken_harness_requests_total counter" in text


def test_completions_use_sessions_too(srv) -> None:
    r = srv.http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2},
                      headers={"X-FreeToken-Session": "sess_missing"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"
    r = srv.http.post("/v1/completions", json={"prompt": "hi"}, headers={"X-FreeToken-Harness": "nope"})
    assert r.status_code == 400
    made = srv.http.post("/v1/sessions", json={"harness": "opencode"}).json()
    srv.engine.push("ab")
    r = srv.http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2},
                      headers={"X-FreeToken-Session": made["id"]})
    assert r.status_code == 200, r.text
    assert srv.engine.last.request.anchors == get_adapter("opencode").anchor_policy()
    got = _session(srv, made["id"])
    assert (got["requests"], got["prompt_tokens"]) == (1, r.json()["usage"]["prompt_tokens"])


def test_count_tokens_makes_no_session(srv) -> None:
    headers = {**CLAUDE_HEADERS, "x-claude-code-session-id": "count-only-0001"}
    r = srv.http.post("/v1/messages/count_tokens", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                      headers=headers)
    assert r.status_code == 200
    assert srv.http.get("/v1/sessions/claude_code:count-only-0001").status_code == 404


def test_session_ids_with_slashes_can_be_read(srv) -> None:
    srv.engine.push("x")
    assert _openai(srv, {"User-Agent": "opencode/1.18.33", "x-session-id": "a/b c"}).status_code == 200
    assert _session(srv, "opencode:a%2Fb%20c")["harness"] == "opencode"
    assert srv.http.delete("/v1/sessions/opencode:a/b c").status_code == 200


def test_detected_sessions_never_push_out_explicit_ones() -> None:
    clock = _Clock()
    store = SessionStore(idle_timeout_s=60, max_sessions=3, clock=clock)
    mine = store.create(get_adapter("claude_code"))
    for i in range(10):
        store.bind(RequestInfo("anthropic", "/v1/messages",
                               {"user-agent": "claude-cli/2.1.197", "x-claude-code-session-id": f"s{i}"}, {}))
    ids = [s.id for s in store.list()]
    assert mine.id in ids and len(ids) == 3
    assert ids[:2] == ["claude_code:s9", "claude_code:s8"]
