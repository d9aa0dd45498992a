"""OpenCode: a provider config file passed with ``OPENCODE_CONFIG``.

Sources: ``real-clients.md`` section 4 (verified with OpenCode 1.18.33) and ``harnesses.md``
sections 2a and 2c. OpenCode merges ``OPENCODE_CONFIG`` after the user's global config and before a
project's ``opencode.json``, so the user's own files are read and never overwritten.

* Provider ``freetoken`` through the AI SDK package ``@ai-sdk/openai-compatible``
  (``POST {baseURL}/chat/completions``); ``@ai-sdk/anthropic`` (``POST {baseURL}/messages``) is
  the alternative the acceptance tests also drive.
* ``limit.context``/``limit.output`` are required for a custom model: without them OpenCode never
  auto-compacts and runs into context-overflow errors instead.
* ``model`` and ``small_model`` (title generation) are both the served model.
* ``timeout`` is the request timeout (default 300 s), ``chunkTimeout`` the longest gap between
  streamed chunks, both in milliseconds.
"""

from __future__ import annotations

from pathlib import Path

from freetoken.agents.target import Target

EXECUTABLE = "opencode"
INSTALL_HINT = "npm install -g opencode-ai"
CONFIG_FILE = "opencode.json"
PROVIDER_ID = "freetoken"
PROVIDER_PACKAGES = ("@ai-sdk/openai-compatible", "@ai-sdk/anthropic")
REQUEST_TIMEOUT_MS = 1_800_000
CHUNK_TIMEOUT_MS = 600_000


def opencode_config(target: Target, package: str = "@ai-sdk/openai-compatible") -> dict:
    """The ``opencode.json`` content for ``target`` through the AI SDK provider ``package``.

    Raises:
        ValueError: ``package`` is not one of ``PROVIDER_PACKAGES``.
    """
    if package not in PROVIDER_PACKAGES:
        raise ValueError(f"provider package {package!r} is not one of {PROVIDER_PACKAGES}")
    model_id = f"{PROVIDER_ID}/{target.model}"
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {PROVIDER_ID: {
            "npm": package,
            "name": "FreeToken",
            "options": {"baseURL": target.openai_base_url, "apiKey": target.api_key,
                        "timeout": REQUEST_TIMEOUT_MS, "chunkTimeout": CHUNK_TIMEOUT_MS},
            "models": {target.model: {
                "name": f"{target.model} (FreeToken)", "tool_call": True,
                "limit": {"context": target.context_window, "output": target.max_output_tokens},
            }},
        }},
        "model": model_id,
        "small_model": model_id,
    }


def opencode_env(config_path: Path) -> dict[str, str]:
    """``OPENCODE_CONFIG``: where OpenCode reads the launch config from."""
    return {"OPENCODE_CONFIG": str(config_path)}
