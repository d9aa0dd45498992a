"""Codex CLI (``@openai/codex``): a custom model provider given as ``-c key=value`` overrides.

Verified with Codex 0.171.0 against a local server (``tests/clients/test_codex.py``). The
overrides rank above ``$CODEX_HOME/config.toml``, so the user's own config (MCP servers, profiles,
sandbox settings) is read and never written; nothing is stored in a FreeToken folder.

* Provider ``freetoken``: ``base_url`` is the server's ``/v1``, ``wire_api = "responses"``
  (Codex calls ``POST {base_url}/responses``, streamed), the key is read from
  ``FREETOKEN_API_KEY`` (``env_key``), so it never appears on a command line; no login needed.
* ``stream_idle_timeout_ms``: a long prefill on an offloaded MoE can pass Codex's 5-minute gap
  between streamed events, hence 30 minutes.
* ``model_context_window`` is the server's context length; ``model_auto_compact_token_limit``
  leaves room for one full reply (context less the output cap), so Codex compacts its history
  before a request can overflow instead of after.
* ``web_search = "disabled"``: the server runs no hosted tool (it would drop the declaration
  anyway); ``analytics.enabled = false``: no usage reports to OpenAI.

Codex still prints that it has no metadata for the model (its built-in list only knows OpenAI
models) and falls back to defaults; the limits above are what matters from that metadata.
"""

from __future__ import annotations

import json

from freetoken.agents.target import Target

EXECUTABLE = "codex"
INSTALL_HINT = "npm install -g @openai/codex"
PROVIDER_ID = "freetoken"
KEY_VARIABLE = "FREETOKEN_API_KEY"
STREAM_IDLE_TIMEOUT_MS = 1_800_000


def _toml(value: object) -> str:
    """A TOML value: a basic string (JSON string escapes are valid TOML) or an integer/bool."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if isinstance(value, int) else json.dumps(str(value))


def codex_overrides(target: Target) -> dict[str, object]:
    """The config keys the launch sets (dotted paths → values), in display order."""
    provider = f"model_providers.{PROVIDER_ID}"
    return {
        "model": target.model,
        "model_provider": PROVIDER_ID,
        f"{provider}.name": "FreeToken",
        f"{provider}.base_url": target.openai_base_url,
        f"{provider}.wire_api": "responses",
        f"{provider}.env_key": KEY_VARIABLE,
        f"{provider}.stream_idle_timeout_ms": STREAM_IDLE_TIMEOUT_MS,
        "model_context_window": target.context_window,
        "model_auto_compact_token_limit": max(1, target.context_window - target.max_output_tokens),
        "web_search": "disabled",
        "analytics.enabled": False,
    }


def codex_args(target: Target) -> tuple[str, ...]:
    """``-c key=value`` for every override (values in TOML, as Codex parses them)."""
    out: list[str] = []
    for key, value in codex_overrides(target).items():
        out += ["-c", f"{key}={_toml(value)}"]
    return tuple(out)


def codex_env(target: Target) -> dict[str, str]:
    """``FREETOKEN_API_KEY``: the key Codex sends as its bearer token (provider ``env_key``)."""
    return {KEY_VARIABLE: target.api_key}
