"""OpenCode (``opencode run``) against the live server, through its OpenAI-compatible provider
(Chat Completions over SSE), its Anthropic provider (Messages over SSE) and its built-in
``openai`` provider (Responses over SSE).

Passing means: exit 0, no ``error`` event in its JSON event stream and no ERROR line in its own log,
the title request (no tools) and the main request (tools, ``tool_choice`` auto) both answered 200
with sound streams, the input tokens OpenCode reports per step equal to what the server's usage
said (so it read the usage the server sent), and the text OpenCode shows equal to the visible text
the server streamed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from . import agents
from .protocol import sse_events
from .runner import assert_clean_run, run_client
from .tap import Exchange

pytestmark = pytest.mark.clients

PATHS = {"@ai-sdk/openai-compatible": "/v1/chat/completions", "@ai-sdk/anthropic": "/v1/messages",
         "openai": "/v1/responses"}


def _served(ex: Exchange) -> tuple[int, str]:
    """(input tokens from the usage the server sent, visible text it streamed) for one call.

    OpenCode counts cache reads apart from input: Chat Completions input is ``prompt_tokens``
    less ``prompt_tokens_details.cached_tokens``, Responses input ``input_tokens`` less
    ``input_tokens_details.cached_tokens`` (Anthropic's ``input_tokens`` already is)."""
    events = [json.loads(data) for _, data in sse_events(ex.response_text()) if data != "[DONE]"]
    if ex.path == "/v1/responses":
        text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        usage = events[-1]["response"]["usage"]
        return usage["input_tokens"] - usage["input_tokens_details"]["cached_tokens"], text
    if ex.path == "/v1/chat/completions":
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in events if c["choices"])
        usage = events[-1]["usage"]
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        return usage["prompt_tokens"] - cached, text
    text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    delta = next(e for e in events if e["type"] == "message_delta")
    return delta["usage"]["input_tokens"], text


@pytest.mark.parametrize("provider", sorted(PATHS))
def test_opencode_run(live, opencode_client, tmp_path: Path, provider: str) -> None:  # noqa: ANN001
    _run(live, opencode_client, tmp_path, provider)


def test_opencode_on_each_family(family_live, opencode_client, tmp_path: Path) -> None:  # noqa: ANN001
    """The Chat Completions run against the tiny checkpoint of each other family."""
    _run(family_live, opencode_client, tmp_path, "@ai-sdk/openai-compatible")


def _run(live, opencode_client, tmp_path: Path, provider: str) -> None:  # noqa: ANN001
    work = tmp_path / "work"
    work.mkdir()
    home = tmp_path / "home"
    argv, env = agents.opencode(opencode_client, live.base_url, live.model, home, work, provider=provider)
    run = run_client(f"opencode run ({provider})", argv, env, work, live.server, live.tap, live.artifacts,
                     timeout=300)
    assert_clean_run(run, live.tap, paths={PATHS[provider]}, model=live.model, min_calls=2)

    events = []
    for line in (line for line in run.stdout.splitlines() if line.strip()):
        try:
            events.append(json.loads(line))
        except ValueError:
            pytest.fail(f"non-JSON line in opencode --format json output: {line[:300]!r}")
    errors = [e for e in events if e.get("type") == "error"]
    assert not errors, f"opencode reported errors: {errors}"
    finishes = [e["part"] for e in events if e.get("type") == "step_finish"]
    assert finishes, f"no step_finish event: {run.stdout[-2000:]}"
    assert all(part.get("reason") in ("stop", "length", "tool-calls") for part in finishes), finishes

    log_errors = [line for log in (home / ".local" / "share" / "opencode" / "log").glob("*.log")
                  for line in log.read_text().splitlines() if "level=ERROR" in line]
    assert not log_errors, f"opencode logged errors: {log_errors[:5]}"

    calls = run.model_calls()
    titled = [ex for ex in calls if not ex.request_json().get("tools")]
    main = [ex for ex in calls if ex.request_json().get("tools")]
    assert titled and main, f"expected a title request and a main request, got {len(titled)} and {len(main)}"
    assert all(ex.stream is True for ex in calls)
    if provider == "@ai-sdk/openai-compatible":
        assert all(ex.request_json().get("stream_options") == {"include_usage": True} for ex in calls)
        assert all(ex.request_json().get("tool_choice") == "auto" for ex in main)
    elif provider == "openai":
        # the AI SDK's Responses model: no server-side state, the launch output cap as the limit
        assert all(ex.request_json().get("store") is False for ex in calls)
        assert all(ex.request_json().get("max_output_tokens") == live.server.max_output_tokens
                   for ex in calls)
        assert all(ex.request_json().get("tool_choice") == "auto" for ex in main)
        assert all(t["type"] == "function" for ex in main for t in ex.request_json()["tools"])
    else:
        assert all(ex.request_json().get("tool_choice") == {"type": "auto"} for ex in main)
    served = [_served(ex) for ex in main]
    reported = [part["tokens"]["input"] for part in finishes]
    assert set(reported) <= {tokens for tokens, _ in served}, f"opencode input tokens {reported} vs {served}"
    shown = "".join(e["part"]["text"] for e in events if e.get("type") == "text")
    assert shown.strip() == "".join(text for _, text in served).strip(), (shown, served)
