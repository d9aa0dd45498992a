"""Command lines, minimal environments and config files of the four agent clients.

Recipes from ``/work/shared/research/real-clients.md`` sections 3 to 6, pointed at the server's base
URL. Each environment is built from nothing (as ``env -i`` would): PATH with the client's folders
first, an isolated HOME, and the client's own switches that keep it on loopback.
"""

from __future__ import annotations

import json
from pathlib import Path

from .install import ClientInstall

PROMPT = "Say hi."
SYSTEM_PATH = "/usr/bin:/bin"


def base_env(client: ClientInstall, home: Path) -> dict[str, str]:
    """``PATH`` (client folders, then /usr/bin:/bin), ``HOME`` and a UTF-8 locale; nothing inherited."""
    home.mkdir(parents=True, exist_ok=True)
    path = ":".join([*(str(p) for p in client.path_dirs), SYSTEM_PATH])
    return {"PATH": path, "HOME": str(home), "LANG": "C.UTF-8", "TERM": "dumb"}


def claude_code(client: ClientInstall, base_url: str, model: str, home: Path, *, tools: str | None,
                max_turns: int) -> tuple[list[str], dict[str, str]]:
    """``claude -p PROMPT --output-format stream-json --verbose`` against ``base_url`` (Anthropic API).

    ``tools`` is the ``--tools`` list (None: Claude Code's default set, ~24 tools). All model
    variables name ``model`` so sub-agents and small-model calls hit the same server model;
    ``CLAUDE_CODE_ATTRIBUTION_HEADER=0`` drops the per-prompt billing block from the system prompt.
    """
    env = base_env(client, home)
    env.update(
        ANTHROPIC_BASE_URL=base_url, ANTHROPIC_API_KEY="dummy",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_TELEMETRY="1", DISABLE_AUTOUPDATER="1",
        DISABLE_ERROR_REPORTING="1", CLAUDE_CODE_ATTRIBUTION_HEADER="0",
        ANTHROPIC_MODEL=model, ANTHROPIC_DEFAULT_HAIKU_MODEL=model, ANTHROPIC_DEFAULT_SONNET_MODEL=model,
        ANTHROPIC_DEFAULT_OPUS_MODEL=model, ANTHROPIC_SMALL_FAST_MODEL=model,
    )
    argv = [str(client.executable), "-p", PROMPT, "--output-format", "stream-json", "--verbose",
            "--max-turns", str(max_turns)]
    if tools is not None:
        argv += ["--tools", tools]
    return argv, env


OPENCODE_PROVIDERS = ("@ai-sdk/openai-compatible", "@ai-sdk/anthropic")


def opencode(client: ClientInstall, base_url: str, model: str, home: Path, workdir: Path,
             provider: str = "@ai-sdk/openai-compatible") -> tuple[list[str], dict[str, str]]:
    """``opencode run --pure --format json`` with a provider ``local`` of the AI SDK package ``provider``.

    ``@ai-sdk/openai-compatible`` calls ``POST /v1/chat/completions``, ``@ai-sdk/anthropic``
    ``POST /v1/messages`` (both bundled in the OpenCode binary). Writes ``workdir/opencode.json``
    (project config; the main and the title model are both ``local/<model>``). ``XDG_CONFIG_HOME`` is
    the installer's prepared config home, so OpenCode finds its plugin installed and does not fetch
    it from the registry.

    Raises:
        ValueError: ``provider`` is not one of ``OPENCODE_PROVIDERS``.
    """
    if provider not in OPENCODE_PROVIDERS:
        raise ValueError(f"provider {provider!r} is not one of {OPENCODE_PROVIDERS}")
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {"local": {
            "npm": provider,
            "options": {"baseURL": f"{base_url}/v1", "apiKey": "dummy"},
            "models": {model: {"name": "FreeToken tiny", "tool_call": True}},
        }},
        "model": f"local/{model}", "small_model": f"local/{model}", "autoupdate": False, "share": "disabled",
    }
    (workdir / "opencode.json").write_text(json.dumps(config, indent=2))
    env = base_env(client, home)
    assert client.config_home is not None, "the OpenCode install has no prepared config home"
    env.update(
        XDG_CONFIG_HOME=str(client.config_home), OPENCODE_DISABLE_MODELS_FETCH="1",
        OPENCODE_DISABLE_AUTOUPDATE="1", OPENCODE_DISABLE_SHARE="1", OPENCODE_DISABLE_LSP_DOWNLOAD="1",
        OPENCODE_DISABLE_DEFAULT_PLUGINS="1", OPENCODE_DISABLE_CLAUDE_CODE="1",
        OPENCODE_DISABLE_EXTERNAL_SKILLS="1",
    )
    argv = [str(client.executable), "run", "--pure", "--format", "json", "-m", f"local/{model}", PROMPT]
    return argv, env


def openclaw(client: ClientInstall, base_url: str, model: str, home: Path, workdir: Path,
             config_path: Path) -> tuple[list[str], dict[str, str]]:
    """``openclaw agent exec PROMPT --json`` (embedded one-turn run, no gateway) on Node 24.

    Provider ``local`` uses ``api: "openai-completions"``. The model's request params add
    ``chat_template_kwargs.enable_thinking=false`` (the documented switch for Qwen-family thinking
    templates) and ``ignore_eos`` (vLLM extension, sent through OpenClaw's ``extra_body``): OpenClaw
    fails a turn whose reply has no visible text, and the random tiny model otherwise often spends
    its whole reply in reasoning or stops at once.
    """
    config = {
        "telemetry": {"enabled": False},
        "update": {"checkOnStart": False},
        "agents": {"defaults": {"models": {f"local/{model}": {"params": {
            "chat_template_kwargs": {"enable_thinking": False},
            "extra_body": {"ignore_eos": True},
        }}}}},
        "models": {"providers": {"local": {
            "baseUrl": f"{base_url}/v1", "apiKey": "dummy", "api": "openai-completions",
            "models": [{"id": model, "name": "FreeToken tiny", "reasoning": False, "input": ["text"],
                        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                        "contextWindow": 128000, "maxTokens": 8192}],
        }}},
    }
    config_path.write_text(json.dumps(config, indent=2))
    env = base_env(client, home)
    env.update(DO_NOT_TRACK="1", OPENCLAW_NO_AUTO_UPDATE="1", CI="1")
    argv = [str(client.executable), "agent", "exec", PROMPT, "--config", str(config_path),
            "--model", f"local/{model}", "--cwd", str(workdir), "--json", "--timeout", "240"]
    return argv, env


def mini_swe_agent(client: ClientInstall, base_url: str, model: str, home: Path, trajectory: Path,
                   step_limit: int) -> tuple[list[str], dict[str, str]]:
    """``mini -y --exit-immediately`` through litellm (``openai/<model>``, non-streaming chat).

    ``agent.step_limit`` bounds the run: the random tiny model never returns the tool call the agent
    requires, so every step ends in mini's format-error feedback and the run exits with
    ``LimitsExceeded`` after ``step_limit`` model calls. ``MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT=1``:
    a failed call is not retried (mini retries 10 times with backoff by default), so a server error
    ends the run at once instead of hiding behind a retry.
    """
    env = base_env(client, home)
    env.update(MSWEA_GLOBAL_CONFIG_DIR=str(home / "mswea"), MSWEA_COST_TRACKING="ignore_errors",
               MSWEA_CONFIGURED="true", LITELLM_LOCAL_MODEL_COST_MAP="True",
               MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT="1")
    argv = [str(client.executable), "-y", "--exit-immediately", "-m", f"openai/{model}", "-t", PROMPT,
            "-c", "mini.yaml", "-c", f"model.model_kwargs.api_base={base_url}/v1",
            "-c", "model.model_kwargs.api_key=dummy", "-c", f"agent.step_limit={step_limit}",
            "-o", str(trajectory)]
    return argv, env
