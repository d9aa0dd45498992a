"""Claude Code: provider settings as environment variables (Anthropic Messages API).

Sources: ``real-clients.md`` section 3 (recipe verified with Claude Code 2.1.197) and
``harnesses.md`` sections 5a-5c. Claude Code speaks only ``POST /v1/messages`` once
``ANTHROPIC_BASE_URL`` is set, so the base URL has no ``/v1``.

* Every model variable names the served model, so the main loop, sub-agents and background
  (Haiku-class) calls all reach the server under a name it serves.
* ``CLAUDE_CODE_ATTRIBUTION_HEADER=0`` drops the billing block that otherwise opens the system
  prompt with a per-prompt hash; with it, sessions diverge at token ~10 and no prefix is shared.
* ``CLAUDE_CODE_MAX_OUTPUT_TOKENS`` and ``CLAUDE_CODE_MAX_CONTEXT_TOKENS`` (read for model names not
  starting with ``claude-``; seen in the 2.1.197 binary) give Claude Code the server's real limits,
  so its auto-compaction fires before the context overflows instead of assuming a 200k window.
* Timeouts: the SDK request timeout (default 600 s) and the stream idle watchdog (default 300 s)
  are raised, since a long prefill on a local machine can exceed both.
"""

from __future__ import annotations

from freetoken.agents.target import Target

EXECUTABLE = "claude"
INSTALL_HINT = "npm install -g @anthropic-ai/claude-code"
API_TIMEOUT_MS = 3_600_000
STREAM_IDLE_TIMEOUT_MS = 1_800_000
MODEL_VARIABLES = ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL",
                   "ANTHROPIC_DEFAULT_HAIKU_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL")


def claude_code_env(target: Target) -> dict[str, str]:
    """The variables that point Claude Code at ``target`` (insertion order is the display order).

    ``ANTHROPIC_AUTH_TOKEN`` is sent as ``Authorization: Bearer``; ``ANTHROPIC_API_KEY`` is set
    empty so no ``x-api-key`` (and no stored login) competes with it.
    """
    env = {"ANTHROPIC_BASE_URL": target.base_url, "ANTHROPIC_AUTH_TOKEN": target.api_key,
           "ANTHROPIC_API_KEY": ""}
    env.update({name: target.model for name in MODEL_VARIABLES})
    env.update({
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "API_TIMEOUT_MS": str(API_TIMEOUT_MS),
        "CLAUDE_STREAM_IDLE_TIMEOUT_MS": str(STREAM_IDLE_TIMEOUT_MS),
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(target.max_output_tokens),
        "CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(target.context_window),
    })
    return env
