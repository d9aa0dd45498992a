"""Codex CLI (``codex exec --json``) against the live server through its custom-provider
support (``wire_api = "responses"``: ``POST /v1/responses``, streamed).

Passing means: exit 0; Codex's JSON events show the thread start, one turn started and
completed, and no error or failed turn (the one ``error`` item allowed is Codex's own note that
it has no metadata for a model outside its built-in list); every call went to
``/v1/responses`` as ``codex_exec`` with the launch settings (served model, ``store: false``,
the function tools Codex runs) and was answered 200 with a sound Responses stream; the usage
Codex reports for the turn equals the sum of what the server's ``response.completed`` events
said (so it read them); the text Codex shows equals the visible text the server streamed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.clients import agents
from tests.clients.install import CODEX_VERSION
from tests.clients.protocol import sse_events
from tests.clients.runner import assert_clean_run, run_client
from tests.clients.tap import Exchange

pytestmark = pytest.mark.clients

METADATA_NOTE = ("Model metadata for `{model}` not found. Defaulting to fallback metadata; this "
                 "can degrade performance and cause issues.")


def _header(ex: Exchange, name: str) -> str:
    return next((v for k, v in ex.request_headers.items() if k.lower() == name), "")


def _completed(ex: Exchange) -> dict:
    """The final ``response`` object of one streamed call."""
    events = [json.loads(data) for _, data in sse_events(ex.response_text())]
    return events[-1]["response"]


def _visible(response: dict) -> str:
    return "".join(part["text"] for item in response["output"] if item["type"] == "message"
                   for part in item["content"] if part["type"] == "output_text")


def test_codex_exec_completes_a_turn(live, codex_client, tmp_path: Path) -> None:  # noqa: ANN001
    work = tmp_path / "work"
    work.mkdir()
    argv, env = agents.codex(codex_client, live.base_url, live.model, tmp_path / "home", work)
    run = run_client("codex exec", argv, env, work, live.server, live.tap, live.artifacts,
                     timeout=300)
    assert_clean_run(run, live.tap, paths={"/v1/responses"}, model=live.model)

    events = []
    for line in (line for line in run.stdout.splitlines() if line.strip()):
        try:
            events.append(json.loads(line))
        except ValueError:
            pytest.fail(f"non-JSON line in codex exec --json output: {line[:300]!r}")
    kinds = [e["type"] for e in events]
    assert kinds[0] == "thread.started" and kinds.count("turn.started") == 1, kinds
    assert kinds[-1] == "turn.completed" and "turn.failed" not in kinds, run.stdout[-2000:]
    assert "error" not in kinds, run.stdout[-2000:]
    errors = [e["item"]["message"] for e in events
              if e["type"] == "item.completed" and e["item"]["type"] == "error"]
    assert errors == [METADATA_NOTE.format(model=live.model)], errors

    calls = run.model_calls()
    for ex in calls:
        body = ex.request_json()
        assert _header(ex, "originator") == "codex_exec"
        assert _header(ex, "user-agent").startswith(f"codex_exec/{CODEX_VERSION} ")
        assert _header(ex, "authorization") == "Bearer freetoken"
        assert body["stream"] is True and body["store"] is False
        assert body["include"] == ["reasoning.encrypted_content"]
        functions = {t["name"] for t in body["tools"] if t["type"] == "function"}
        assert {"exec_command", "write_stdin"} <= functions, functions
        assert not [t for t in body["tools"] if t["type"] == "web_search"], "web search is off"
    served = [_completed(ex) for ex in calls]
    usage = events[-1]["usage"]
    assert usage["input_tokens"] == sum(r["usage"]["input_tokens"] for r in served)
    assert usage["output_tokens"] == sum(r["usage"]["output_tokens"] for r in served)
    assert usage["cached_input_tokens"] == sum(
        r["usage"]["input_tokens_details"]["cached_tokens"] for r in served)
    shown = "".join(e["item"]["text"] for e in events
                    if e["type"] == "item.completed" and e["item"]["type"] == "agent_message")
    assert shown.strip() == "".join(_visible(r) for r in served).strip(), (shown, served)
