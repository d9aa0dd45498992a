"""mini-swe-agent: model settings as environment variables (litellm, OpenAI Chat Completions).

Sources: ``real-clients.md`` section 6 (verified with mini-swe-agent 2.4.6 and litellm 1.110.2) and
``harnesses.md`` section 4a. Environment variables rather than ``-c`` options, because ``mini``
drops its default config as soon as one ``-c`` is given: the user's own ``-c`` options keep their
meaning. The environment also wins over mini's ``.env`` global config (loaded without override).

* ``MSWEA_MODEL_NAME=openai/<model>``: litellm's OpenAI provider, which reads ``OPENAI_BASE_URL``
  and ``OPENAI_API_KEY`` (both cleared from the caller's environment first, then set here).
* ``MSWEA_COST_TRACKING=ignore_errors``: litellm has no price for a local model; without it every
  step fails with "Error calculating cost".
* ``LITELLM_LOCAL_MODEL_COST_MAP=True``: litellm reads its bundled price map instead of
  downloading it at import.
* ``MSWEA_CONFIGURED=true``: skips the first-run wizard that asks for a cloud model and key.
"""

from __future__ import annotations

from freetoken.agents.target import Target

EXECUTABLE = "mini"
INSTALL_HINT = "pip install mini-swe-agent (or: uv tool install mini-swe-agent)"


def mini_swe_agent_env(target: Target) -> dict[str, str]:
    """The variables that point mini-swe-agent (through litellm) at ``target``."""
    return {
        "MSWEA_MODEL_NAME": f"openai/{target.model}",
        "OPENAI_BASE_URL": target.openai_base_url,
        "OPENAI_API_KEY": target.api_key,
        "MSWEA_COST_TRACKING": "ignore_errors",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "MSWEA_CONFIGURED": "true",
    }
