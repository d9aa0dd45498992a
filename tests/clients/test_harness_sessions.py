"""Issue 5 acceptance with the real clients: each client's adapter is detected automatically (the
session it lands in names its harness), and a second turn reuses at least 90% of the prompt prefix
it shares with an earlier turn.

Two turns per client: Claude Code ``-p`` then ``-p -c`` (continue; with its attribution line left
ON, so the adapter's normalisation is what keeps the prefix), OpenCode ``run`` then ``run -c``,
OpenClaw two ``agent exec`` runs on one ``--state-dir``, mini-swe-agent two steps of one run (the
format-error retry). The unchanged prefix of a call is its longest common token prefix with any
earlier call of the same run, rendered the way the server renders them (``render.rendered_ids``);
the reused tokens are what the server reported in that call's usage.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from harness_adapters import RequestInfo, detect_adapter
from . import agents
from .protocol import sse_events
from .render import common_prefix, rendered_ids
from .runner import SUMMARIES, ClientRun, assert_clean_run, run_client
from .tap import Exchange

pytestmark = pytest.mark.clients

MIN_SHARED = 64  # a call sharing fewer tokens with earlier ones is a new conversation (e.g. a title request)


def _usage(ex: Exchange) -> tuple[int, int]:
    """``(prompt tokens, reused tokens)`` the server reported for one call."""
    text = ex.response_text()
    if "text/event-stream" not in ex.response_headers.get("content-type", ""):
        usage = json.loads(text)["usage"]
    else:
        events = [json.loads(d) for _, d in sse_events(text) if d != "[DONE]"]
        if ex.path == "/v1/messages":
            usage = next(e["usage"] for e in reversed(events) if e.get("type") == "message_delta")
        else:
            usage = next(e["usage"] for e in reversed(events) if e.get("usage"))
    if "prompt_tokens" in usage:
        return usage["prompt_tokens"], (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    cached = usage.get("cache_read_input_tokens", 0)
    return usage["input_tokens"] + cached, cached


def _session_id(ex: Exchange) -> tuple[str, str]:
    """(detected harness, implicit session id) of a recorded call, as the server derives them."""
    api = "anthropic" if ex.path.startswith("/v1/messages") else "openai"
    info = RequestInfo(api=api, path=ex.path, headers={k.lower(): v for k, v in ex.request_headers.items()},
                       body=ex.request_json())
    adapter = detect_adapter(info)
    return adapter.name, f"{adapter.name}:{adapter.session_key(info) or 'default'}"


def check_sessions_and_reuse(live, calls: list[Exchange], harness: str) -> list[tuple[int, int]]:  # noqa: ANN001
    """Asserts the detected harness of every call and of its server session, and reuse ≥ 90% of the
    unchanged prefix on every later call; returns ``(unchanged, reused)`` per later call."""
    sessions: dict[str, int] = {}
    for ex in calls:
        name, sid = _session_id(ex)
        assert name == harness, f"{ex.target}: detected {name!r}, expected {harness!r}"
        sessions[sid] = sessions.get(sid, 0) + 1
    for sid, count in sessions.items():
        r = httpx.get(f"{live.server.base_url}/v1/sessions/{sid}", timeout=10)
        assert r.status_code == 200, r.text
        got = r.json()
        assert (got["harness"], got["explicit"]) == (harness, False), got
        assert got["requests"] >= count, got
    renders = [rendered_ids(ex) for ex in calls]
    checked = []
    for i in range(1, len(calls)):
        unchanged = max(common_prefix(renders[i], renders[j]) for j in range(i))
        if unchanged < MIN_SHARED:
            continue
        prompt, reused = _usage(calls[i])
        assert prompt == len(renders[i]), (calls[i].target, prompt, len(renders[i]))
        assert reused >= 0.9 * unchanged, f"call {i}: reused {reused} of an unchanged prefix of {unchanged}"
        checked.append((unchanged, reused))
    assert checked, f"no second turn sharing >= {MIN_SHARED} tokens with an earlier one"
    SUMMARIES.append(f"{harness}: sessions {sorted(sessions)}; later calls (unchanged prefix, reused): {checked}")
    return checked


def _two_runs(label: str, first: tuple[list[str], dict], second: tuple[list[str], dict], work: Path,
              live, paths: set[str]) -> list[Exchange]:  # noqa: ANN001
    runs: list[ClientRun] = []
    for n, (argv, env) in enumerate((first, second), 1):
        run = run_client(f"{label} turn {n}", argv, env, work, live.server, live.tap, live.artifacts, timeout=400)
        assert_clean_run(run, live.tap, paths=paths, model=live.model)
        runs.append(run)
    return [ex for run in runs for ex in run.model_calls()]


def test_claude_code_two_turns(live, claude_code_client, tmp_path: Path) -> None:  # noqa: ANN001
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    argv, env = agents.claude_code(claude_code_client, live.base_url, live.model, home, tools="Bash,Read,Edit",
                                   max_turns=1)
    env.pop("CLAUDE_CODE_ATTRIBUTION_HEADER")  # the adapter must cope with the per-request line
    second = [a if a != agents.PROMPT else "Now say bye." for a in argv] + ["--continue"]
    calls = _two_runs("claude-code sessions", (argv, env), (second, env), work, live, {"/v1/messages"})
    systems = [ex.request_json()["system"][0]["text"] for ex in calls]
    assert all(s.startswith("x-anthropic-billing-header:") for s in systems), systems
    check_sessions_and_reuse(live, calls, "claude_code")


def test_opencode_two_turns(live, opencode_client, tmp_path: Path) -> None:  # noqa: ANN001
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    argv, env = agents.opencode(opencode_client, live.base_url, live.model, home, work)
    second = [a if a != agents.PROMPT else "Now say bye." for a in argv]
    second.insert(second.index("run") + 1, "--continue")
    calls = _two_runs("opencode sessions", (argv, env), (second, env), work, live, {"/v1/chat/completions"})
    check_sessions_and_reuse(live, calls, "opencode")


def test_openclaw_two_turns(live, openclaw_client, tmp_path: Path) -> None:  # noqa: ANN001
    home, work, state = tmp_path / "home", tmp_path / "work", tmp_path / "state"
    work.mkdir()
    state.mkdir()
    argv, env = agents.openclaw(openclaw_client, live.base_url, live.model, home, work, tmp_path / "openclaw.json5")
    argv = argv + ["--state-dir", str(state)]
    second = [a if a != agents.PROMPT else "Now say bye." for a in argv]
    calls = _two_runs("openclaw sessions", (argv, env), (second, env), work, live, {"/v1/chat/completions"})
    check_sessions_and_reuse(live, calls, "openclaw")


def test_mini_swe_agent_two_steps(live, mini_swe_agent_client, tmp_path: Path) -> None:  # noqa: ANN001
    work = tmp_path / "work"
    work.mkdir()
    argv, env = agents.mini_swe_agent(mini_swe_agent_client, live.base_url, live.model, tmp_path / "home",
                                      tmp_path / "traj.json", 2)
    run = run_client("mini-swe-agent sessions", argv, env, work, live.server, live.tap, live.artifacts, timeout=300)
    assert_clean_run(run, live.tap, paths={"/v1/chat/completions"}, model=live.model, min_calls=2)
    check_sessions_and_reuse(live, run.model_calls(), "mini_swe_agent")
