"""Claude Code (``claude -p``, Anthropic Messages over SSE) against the live server.

Passing means: exit 0, a ``result`` event of subtype ``success`` with no API error status, no API
retry, every ``POST /v1/messages?beta=true`` answered 200 with a sound event stream, and Claude
Code's own token accounting (new input plus prefix-cache reads) equal to the prompt tokens the
server reported (so it consumed every response it was sent).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from . import agents
from .runner import ClientRun, assert_clean_run, response_id, run_client
from .protocol import sse_events

pytestmark = pytest.mark.clients


def _events(run: ClientRun) -> list[dict]:
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:
            pytest.fail(f"non-JSON line in stream-json output: {line[:300]!r}")
    return events


def _server_messages(run: ClientRun) -> list[dict]:
    """Per model call: the ``message_start`` message and whether any content block was streamed."""
    out = []
    for ex in run.model_calls():
        events = [json.loads(data) for _, data in sse_events(ex.response_text())]
        start = next(e["message"] for e in events if e["type"] == "message_start")
        blocks = [e for e in events if e["type"] == "content_block_start"]
        out.append({"id": response_id(ex), "input_tokens": start["usage"]["input_tokens"],
                    "cache_read": start["usage"]["cache_read_input_tokens"], "blocks": len(blocks)})
    return out


def _check(run: ClientRun, live) -> list[dict]:  # noqa: ANN001 - the Live fixture object
    assert_clean_run(run, live.tap, paths={"/v1/messages"}, model=live.model)
    assert {(ex.method, ex.path) for ex in run.exchanges} <= {("HEAD", "/"), ("POST", "/v1/messages")}
    for ex in run.model_calls():
        assert ex.query == "beta=true" and ex.stream is True, f"{ex.target} stream={ex.stream}"
    events = _events(run)
    init, result = events[0], events[-1]
    assert (init.get("type"), init.get("subtype"), init.get("model")) == ("system", "init", live.model)
    assert result.get("type") == "result", result
    assert (result["subtype"], result["is_error"], result.get("api_error_status")) == ("success", False, None), result
    retries = [e for e in events if e.get("type") == "system" and e.get("subtype") == "api_retry"]
    assert not retries, f"Claude Code retried API calls: {retries}"
    api_errors = [e for e in events if e.get("type") == "assistant" and e.get("error")]
    assert not api_errors, f"assistant messages flagged as API errors: {api_errors}"
    served = _server_messages(run)
    # message_start already splits each prompt into new input and prefix-cache reads (as the
    # final usage does), and Claude Code adds them up
    usage = result["usage"]
    assert (usage["input_tokens"], usage.get("cache_read_input_tokens", 0)) == (
        sum(m["input_tokens"] for m in served), sum(m["cache_read"] for m in served)), (usage, served)
    seen = {e["message"]["id"] for e in events if e.get("type") == "assistant"}
    shown = [m["id"] for m in served if m["blocks"]]
    assert set(shown) <= seen, f"responses with content not surfaced by Claude Code: {set(shown) - seen}"
    return events


def test_claude_code_lean_tools(live, claude_code_client, tmp_path: Path) -> None:  # noqa: ANN001
    """``--tools Bash,Read,Edit`` (~3k-token prompt), up to 2 turns."""
    _lean_tools(live, claude_code_client, tmp_path)


def test_claude_code_on_each_family(family_live, claude_code_client, tmp_path: Path) -> None:  # noqa: ANN001
    """The same run against the tiny checkpoint of each other family (its template, tool-call
    format and model)."""
    _lean_tools(family_live, claude_code_client, tmp_path)


def _lean_tools(live, claude_code_client, tmp_path: Path) -> None:  # noqa: ANN001
    argv, env = agents.claude_code(claude_code_client, live.base_url, live.model, tmp_path / "home",
                                   tools="Bash,Read,Edit", max_turns=2)
    work = tmp_path / "work"
    work.mkdir()
    run = run_client("claude-code --tools Bash,Read,Edit", argv, env, work, live.server, live.tap,
                     live.artifacts, timeout=300)
    events = _check(run, live)
    assert sorted(events[0]["tools"]) == ["Bash", "Edit", "Read"]
    for ex in run.model_calls():
        assert sorted(t["name"] for t in ex.request_json()["tools"]) == ["Bash", "Edit", "Read"]


def test_claude_code_default_tools(live, claude_code_client, tmp_path: Path) -> None:  # noqa: ANN001
    """Claude Code's default tool set (~25k tokens of our tokenizer per request), one turn."""
    argv, env = agents.claude_code(claude_code_client, live.base_url, live.model, tmp_path / "home",
                                   tools=None, max_turns=1)
    work = tmp_path / "work"
    work.mkdir()
    run = run_client("claude-code default tools", argv, env, work, live.server, live.tap, live.artifacts,
                     timeout=400)
    _check(run, live)
    first = run.model_calls()[0].request_json()
    assert len(first["tools"]) >= 15, f"expected the default tool set, got {len(first['tools'])} tools"
