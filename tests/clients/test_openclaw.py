"""OpenClaw (``openclaw agent exec``, ``openai-completions`` provider, Chat Completions over SSE, on
Node 24) against the live server.

Passing means: exit 0, ``ok: true`` / ``status: "ok"`` with no ``error`` in its JSON result, every
call answered 200 with a sound stream, and OpenClaw's usage totals equal to the sums of the usage
chunks the server sent. The provider config asks for ``enable_thinking: false`` and ``ignore_eos``
(see ``agents.openclaw``): OpenClaw fails any turn without visible text, which the random tiny model
would otherwise often produce.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from . import agents
from .protocol import sse_events
from .runner import assert_clean_run, run_client

pytestmark = pytest.mark.clients


def _usage(ex) -> dict:  # noqa: ANN001 - an Exchange
    chunks = [json.loads(data) for _, data in sse_events(ex.response_text()) if data != "[DONE]"]
    return chunks[-1]["usage"]


def test_openclaw_openai_completions(live, openclaw_client, tmp_path: Path) -> None:  # noqa: ANN001
    work = tmp_path / "work"
    work.mkdir()
    argv, env = agents.openclaw(openclaw_client, live.base_url, live.model, tmp_path / "home", work,
                                tmp_path / "openclaw.json5")
    run = run_client("openclaw agent exec (openai-completions)", argv, env, work, live.server, live.tap,
                     live.artifacts, timeout=300)
    assert_clean_run(run, live.tap, paths={"/v1/chat/completions"}, model=live.model)

    try:
        result = json.loads(run.stdout)
    except ValueError:
        pytest.fail(f"openclaw --json printed no JSON document: {run.stdout[-2000:]!r}")
    assert (result.get("ok"), result.get("status")) == (True, "ok"), result
    assert "error" not in result, result["error"]

    calls = run.model_calls()
    for ex in calls:
        body = ex.request_json()
        assert body["stream"] is True and body.get("stream_options") == {"include_usage": True}
        assert body.get("chat_template_kwargs") == {"enable_thinking": False} and body.get("ignore_eos") is True
        assert "max_completion_tokens" in body and len(body.get("tools") or []) >= 5, sorted(body)
    served = [_usage(ex) for ex in calls]
    assert result["usage"]["input"] == sum(u["prompt_tokens"] for u in served), (result["usage"], served)
    assert result["usage"]["output"] == sum(u["completion_tokens"] for u in served), (result["usage"], served)
