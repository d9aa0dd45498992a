"""Detection on request shapes of the real clients, precedence, versions, session keys and the
registry's names."""

from __future__ import annotations

import pytest

from harness_adapters import (
    HARNESS_HEADER, RequestInfo, adapter_names, detect_adapter, detection_scores, get_adapter,
)
from tests.harness_adapters import client_requests as req


@pytest.mark.parametrize("info, expected", [
    (req.claude_code(), "claude_code"),
    (req.opencode(), "opencode"),
    (req.openclaw_openai(), "openclaw"),
    (req.openclaw_anthropic(), "openclaw"),
    (req.mini_swe_agent(), "mini_swe_agent"),
    (req.swe_agent(), "swe_agent"),
    (req.codex(), "codex"),
    (req.litellm_anthropic(), "generic"),
    (req.openai_sdk(), "generic"),
], ids=["claude-code", "opencode", "openclaw-openai", "openclaw-anthropic", "mini-swe-agent",
        "swe-agent", "codex", "litellm-anthropic", "openai-sdk"])
def test_real_client_shapes_are_detected(info: RequestInfo, expected: str) -> None:
    assert detect_adapter(info).name == expected


def test_scores_of_each_client() -> None:
    assert detection_scores(req.claude_code()) == {
        "claude_code": 1.0, "opencode": 0.0, "openclaw": 0.0, "swe_agent": 0.0,
        "mini_swe_agent": 0.0, "codex": 0.0, "generic": 0.0}
    assert detection_scores(req.opencode())["opencode"] == 0.95
    assert detection_scores(req.openclaw_openai())["openclaw"] == 0.97
    assert detection_scores(req.mini_swe_agent())["mini_swe_agent"] == 0.9
    assert detection_scores(req.swe_agent())["swe_agent"] == 0.95
    assert set(detection_scores(req.openai_sdk()).values()) == {0.0}


def test_claude_code_fires_on_the_attribution_line_alone() -> None:
    info = req.claude_code(headers=False)
    assert detection_scores(info)["claude_code"] == 1.0
    # the same line reaching us through a proxy that speaks OpenAI
    body = {"messages": [{"role": "system", "content": req.BILLING_LINE + "\nYou are Claude Code."},
                         {"role": "user", "content": "hi"}]}
    proxied = RequestInfo("openai", "/v1/chat/completions", {"User-Agent": "litellm/1.110.2"}, body)
    assert detect_adapter(proxied).name == "claude_code"


def test_claude_code_header_signals_without_the_line() -> None:
    no_line = req.claude_code(billing=False)
    assert get_adapter("claude_code").detect(no_line) == 0.95
    only_session = RequestInfo("anthropic", "/v1/messages",
                               {"x-claude-code-session-id": "s"}, {"messages": []})
    assert get_adapter("claude_code").detect(only_session) == 0.9
    only_app = RequestInfo("anthropic", "/v1/messages", {"X-App": "cli"}, {})
    assert get_adapter("claude_code").detect(only_app) == 0.5
    assert get_adapter("claude_code").detect(RequestInfo("openai", "/v1/chat/completions",
                                                         {"X-App": "cli"}, {})) == 0.0


def test_weaker_body_signals() -> None:
    assert get_adapter("opencode").detect(req.opencode(user_agent=False)) == 0.6
    bare_bash = req.mini_swe_agent(instructions=False)
    assert detection_scores(bare_bash)["mini_swe_agent"] == 0.5
    body = {"messages": [{"role": "system", "content": "SETTING: You are an autonomous programmer, "
                          "and you're working directly in the command line."}]}
    classic = RequestInfo("openai", "/v1/chat/completions", {}, body)
    assert detect_adapter(classic).name == "swe_agent"
    text_mode = {"messages": [{"role": "system", "content": "Reply with one ```mswea_bash_command block."},
                              {"role": "user", "content": "Fix it."}]}
    assert get_adapter("mini_swe_agent").detect(RequestInfo("openai", "/v1/chat/completions",
                                                            {}, text_mode)) == 0.85
    tools = [{"name": n, "input_schema": {}} for n in ("exec", "sessions_spawn", "memory_search",
                                                       "session_status")]
    by_tools = RequestInfo("anthropic", "/v1/messages", {}, {"tools": tools, "messages": []})
    assert detection_scores(by_tools)["openclaw"] == 0.7


def test_highest_confidence_wins() -> None:
    # OpenCode UA (0.95) over a lone bash tool (mini-swe-agent 0.5)
    oc = req.opencode()
    body = {**oc.body, "tools": [req.MINI_BASH]}
    info = RequestInfo("openai", "/v1/chat/completions", oc.headers, body)
    scores = detection_scores(info)
    assert (scores["opencode"], scores["mini_swe_agent"]) == (0.95, 0.5)
    assert detect_adapter(info).name == "opencode"
    # Claude Code's line (1.0) over OpenClaw's tool names (0.7) and SWE-agent's UA (0.95)
    cc = req.claude_code()
    tools = [{"name": n, "input_schema": {}} for n in ("sessions_spawn", "memory_get", "canvas")]
    mixed = RequestInfo("anthropic", "/v1/messages", {"User-Agent": "swe-agent/1.1.0"},
                        {**cc.body, "tools": tools})
    assert {k: v for k, v in detection_scores(mixed).items() if v} == {
        "claude_code": 1.0, "openclaw": 0.7, "swe_agent": 0.95}
    assert detect_adapter(mixed).name == "claude_code"
    # SWE-agent UA (0.95) over mini-swe-agent's instructions (0.85)
    mini = req.mini_swe_agent()
    relabelled = RequestInfo("openai", "/v1/chat/completions", {"User-Agent": "swe-agent/1.1.0"},
                             {**mini.body, "tools": []})
    assert detect_adapter(relabelled).name == "swe_agent"


def test_forced_harness_header() -> None:
    forced = RequestInfo("openai", "/v1/chat/completions", {"X-FreeToken-Harness": "Mini-SWE-Agent"},
                         req.claude_code().body)
    assert detect_adapter(forced).name == "mini_swe_agent"
    bad = RequestInfo("openai", "/v1/chat/completions", {HARNESS_HEADER: "cursor"}, {})
    with pytest.raises(ValueError) as err:
        detect_adapter(bad)
    assert str(err.value) == ("unknown harness 'cursor'; expected one of: claude_code, opencode, "
                              "openclaw, swe_agent, mini_swe_agent, codex, generic")


def test_versions() -> None:
    cc = get_adapter("claude_code")
    assert cc.version(req.claude_code()) == (2, 1, 197)
    # from the attribution line when the UA is missing: 2.1.154.123 -> 3 components
    assert cc.version(req.claude_code("2.1.154", headers=False)) == (2, 1, 154)
    assert cc.version(req.openai_sdk()) is None
    assert get_adapter("opencode").version(req.opencode()) == (1, 18, 33)
    assert get_adapter("swe_agent").version(req.swe_agent()) == (1, 1, 0)
    for name in ("openclaw", "mini_swe_agent", "generic"):
        assert get_adapter(name).version(req.openclaw_openai()) is None


def test_session_keys() -> None:
    cc = get_adapter("claude_code")
    assert cc.session_key(req.claude_code()) == req.CC_SESSION
    assert cc.session_key(req.claude_code(headers=False)) == req.CC_SESSION  # metadata.user_id
    legacy = RequestInfo("anthropic", "/v1/messages", {}, {"metadata": {
        "user_id": "user_ab12_account__session_0f1e2d3c-4b5a-6978-8897-a6b5c4d3e2f1"}})
    assert cc.session_key(legacy) == "0f1e2d3c-4b5a-6978-8897-a6b5c4d3e2f1"
    assert cc.session_key(RequestInfo("anthropic", "/v1/messages", {},
                                      {"metadata": {"user_id": 7}})) is None
    assert get_adapter("opencode").session_key(req.opencode()) == "ses_42"
    assert get_adapter("openclaw").session_key(req.openclaw_openai()) == "agent:main:7f3a"
    assert get_adapter("openclaw").session_key(req.openclaw_anthropic()) is None
    first = req.openclaw_openai().body["messages"][:2]
    later = [{"role": "user", "content": f"follow-up {k}"} for k in range(12)]
    long_session = RequestInfo("openai", "/v1/chat/completions", {}, {"messages": first + later})
    assert get_adapter("openclaw").session_key(long_session) == "agent:main:7f3a"
    for name in ("swe_agent", "mini_swe_agent", "generic"):
        assert get_adapter(name).session_key(req.claude_code()) is None


@pytest.mark.parametrize("body", [
    {}, {"messages": "x"}, {"messages": [None, 3, {"role": "user", "content": 5}]},
    {"system": 12, "tools": "bash"}, {"system": [None, {"text": 3}], "tools": [1, {"function": 2}]},
    {"metadata": [], "messages": [{"role": "user", "content": [{"type": "tool_result", "content": None}]}]},
])
def test_odd_bodies_never_raise(body: dict) -> None:
    info = RequestInfo("anthropic", "/v1/messages", {}, body)
    assert detect_adapter(info).name == "generic"
    for name in adapter_names():
        adapter = get_adapter(name)
        adapter.version(info)
        adapter.session_key(info)


def test_request_info_checks_and_header_lookup() -> None:
    info = RequestInfo("openai", "/v1/completions", {"User-Agent": "x/1", "X-Session-Id": "s"}, {})
    assert dict(info.headers) == {"user-agent": "x/1", "x-session-id": "s"}
    assert info.header("USER-AGENT") == "x/1" and info.header("absent") == ""
    with pytest.raises(ValueError, match=r"RequestInfo.api must be one of \('openai', 'anthropic'\), got 'grpc'"):
        RequestInfo("grpc", "/", {}, {})
    with pytest.raises(TypeError, match="RequestInfo.body must be a JSON object"):
        RequestInfo("openai", "/", {}, [])
    with pytest.raises(TypeError, match="RequestInfo.headers must be a mapping"):
        RequestInfo("openai", "/", [("a", "b")], {})


def test_registry_names_and_aliases() -> None:
    assert adapter_names() == ("claude_code", "opencode", "openclaw", "swe_agent",
                               "mini_swe_agent", "codex", "generic")
    aliases = {"claude": "claude_code", "claude-code": "claude_code", "Claude Code": "claude_code",
               "mini-swe-agent": "mini_swe_agent", "mini": "mini_swe_agent",
               "swe-agent": "swe_agent", "opencode": "opencode", "openclaw": "openclaw",
               " GENERIC ": "generic"}
    for alias, name in aliases.items():
        assert get_adapter(alias).name == name
    for name in adapter_names():
        adapter = get_adapter(name)
        assert adapter.name == name and adapter.title
    with pytest.raises(TypeError, match="harness name must be a string, got int"):
        get_adapter(3)
