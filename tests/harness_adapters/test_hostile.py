"""Hostile request shapes: detection and session keys stay fast and never raise on what a
client may send (runs on the event loop, before the body is validated)."""

from __future__ import annotations

from harness_adapters import RequestInfo, detect_adapter
from harness_adapters.base import parse_version
from harness_adapters.openclaw import runtime_session


def test_absurd_version_numbers_read_as_no_version() -> None:
    assert parse_version("9" * 5000) is None
    assert parse_version("2.1." + "7" * 10) is None
    assert parse_version("2.1.197") == (2, 1, 197)
    info = RequestInfo("anthropic", "/v1/messages", {"user-agent": "claude-cli/" + "9" * 5000},
                       {"messages": [], "system": f"x-anthropic-billing-header: cc_version={'1' * 5000};"})
    adapter = detect_adapter(info)
    assert (adapter.name, adapter.version(info)) == ("claude_code", None)


def test_runtime_session_is_linear_and_exact() -> None:
    """180 KB of repeated ``Runtime: `` took the old regex 91 s; the line scan is linear."""
    assert runtime_session("[Mon] hi\n\nRuntime: agent=main | session=abc-1 | model=m") == "abc-1"
    assert runtime_session("Runtime: xsession=no | session=yes") == "yes"
    assert runtime_session("Runtime: agent=main\nsession=outside") is None
    hostile = "Runtime: " * 20000 + "session"
    assert runtime_session(hostile) is None
    info = RequestInfo("openai", "/v1/chat/completions", {"x-freetoken-harness": "openclaw"},
                       {"messages": [{"role": "user", "content": hostile}] * 3})
    assert detect_adapter(info).session_key(info) is None
