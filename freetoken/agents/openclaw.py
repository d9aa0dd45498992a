"""OpenClaw: a config file passed with ``OPENCLAW_CONFIG_PATH``.

Sources: ``real-clients.md`` section 5 (verified with OpenClaw 2026.9.6), ``harnesses.md`` sections
1a-1c and OpenClaw's own docs (``docs/start/getting-started.md``: ``OPENCLAW_CONFIG_PATH`` overrides
the config file path for every command, the gateway and ``agent exec`` alike). The file is JSON,
which OpenClaw's JSON5 loader reads as is; it replaces ``~/.openclaw/openclaw.json`` for the launched
process only.

* Provider ``freetoken`` with ``api: "openai-completions"`` (``POST {baseUrl}/chat/completions``).
* ``reasoning: true`` on the model entry: with ``false`` (the default for custom providers) OpenClaw
  strips the reasoning of earlier assistant messages on every request (edit E1), rewriting the
  most recent turn at each tool step and defeating the server's prefix cache.
* ``contextWindow``/``maxTokens`` are the server's limits (otherwise budgeting assumes 200000).
* ``timeoutSeconds`` overrides the provider's HTTP and stream-idle watchdogs.
"""

from __future__ import annotations

from pathlib import Path

from freetoken.agents.target import Target

EXECUTABLE = "openclaw"
INSTALL_HINT = "npm install -g openclaw@latest (needs Node >= 24.16)"
CONFIG_FILE = "openclaw.json"
PROVIDER_ID = "freetoken"
TIMEOUT_S = 1800


def openclaw_config(target: Target) -> dict:
    """The OpenClaw config for ``target``: the provider, the primary model, telemetry off."""
    return {
        "telemetry": {"enabled": False},
        "agents": {"defaults": {"model": {"primary": f"{PROVIDER_ID}/{target.model}"}}},
        "models": {"mode": "merge", "providers": {PROVIDER_ID: {
            "baseUrl": target.openai_base_url,
            "apiKey": target.api_key,
            "api": "openai-completions",
            "timeoutSeconds": TIMEOUT_S,
            "models": [{
                "id": target.model, "name": f"{target.model} (FreeToken)", "reasoning": True,
                "input": ["text"], "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                "contextWindow": target.context_window, "maxTokens": target.max_output_tokens,
            }],
        }}},
    }


def openclaw_env(config_path: Path) -> dict[str, str]:
    """``OPENCLAW_CONFIG_PATH``: where OpenClaw reads the launch config from."""
    return {"OPENCLAW_CONFIG_PATH": str(config_path)}
