"""Command lines, minimal environments and config files of the agent clients.

The provider settings (environment variables, config documents) are exactly what ``freetoken launch``
uses, built by ``freetoken.agents`` from the live server's ``GET /v1/models`` card, so these tests
also prove the launch settings work with the real clients. On top of them come the tests' own
isolation settings (recipes of ``/work/shared/research/real-clients.md`` sections 3 to 6): each
environment is built from nothing (as ``env -i`` would), with PATH holding the client's folders
first, an isolated HOME and the client's switches that keep it on loopback; plus step and time
limits and the OpenClaw request params described in ``README.md``.
"""

from __future__ import annotations

from pathlib import Path

from freetoken.agents.claude_code import claude_code_env
from freetoken.agents.codex import codex_args, codex_env
from freetoken.agents.discover import discover
from freetoken.agents.launch import write_config
from freetoken.agents.mini_swe_agent import mini_swe_agent_env
from freetoken.agents.openclaw import openclaw_config, openclaw_env
from freetoken.agents.opencode import PROVIDER_PACKAGES, opencode_config, opencode_env
from freetoken.agents.plan import config_text
from freetoken.agents.target import Target, resolve_target

from .install import ClientInstall

PROMPT = "Say hi."
SYSTEM_PATH = "/usr/bin:/bin"
# The AI SDK packages of the launch provider, plus OpenCode's built-in ``openai`` provider
# (``POST /v1/responses``) re-pointed at the server.
OPENCODE_PROVIDERS = (*PROVIDER_PACKAGES, "openai")


def base_env(client: ClientInstall, home: Path) -> dict[str, str]:
    """``PATH`` (client folders, then /usr/bin:/bin), ``HOME`` and a UTF-8 locale; nothing inherited."""
    home.mkdir(parents=True, exist_ok=True)
    path = ":".join([*(str(p) for p in client.path_dirs), SYSTEM_PATH])
    return {"PATH": path, "HOME": str(home), "LANG": "C.UTF-8", "TERM": "dumb"}


def launch_target(base_url: str, model: str) -> Target:
    """What ``freetoken launch`` points agents at: ``model``'s card from ``GET {base_url}/v1/models``.

    Raises:
        freetoken.agents.DiscoveryError: the server does not list ``model`` or its card is unusable.
        AssertionError: the card lacks the context length or the output cap (FreeToken states both).
    """
    target, notes = resolve_target(discover(base_url, model))
    assert not notes, notes
    return target


def claude_code(client: ClientInstall, base_url: str, model: str, home: Path, *, tools: str | None,
                max_turns: int) -> tuple[list[str], dict[str, str]]:
    """``claude -p PROMPT --output-format stream-json --verbose`` against ``base_url`` (Anthropic API).

    ``tools`` is the ``--tools`` list (None: Claude Code's default set, ~24 tools). The launch
    settings name ``model`` in every model variable (sub-agents and small-model calls hit the same
    server model) and set ``CLAUDE_CODE_ATTRIBUTION_HEADER=0`` (no per-prompt billing block).
    """
    env = base_env(client, home)
    env.update(claude_code_env(launch_target(base_url, model)))
    env.update(DISABLE_AUTOUPDATER="1", DISABLE_ERROR_REPORTING="1")
    argv = [str(client.executable), "-p", PROMPT, "--output-format", "stream-json", "--verbose",
            "--max-turns", str(max_turns)]
    if tools is not None:
        argv += ["--tools", tools]
    return argv, env


def opencode(client: ClientInstall, base_url: str, model: str, home: Path, workdir: Path,
             provider: str = "@ai-sdk/openai-compatible") -> tuple[list[str], dict[str, str]]:
    """``opencode run --pure --format json`` with the launch provider ``freetoken`` through the AI SDK
    package ``provider``, or (``provider="openai"``) the same settings on OpenCode's built-in
    ``openai`` provider.

    ``@ai-sdk/openai-compatible`` calls ``POST /v1/chat/completions``, ``@ai-sdk/anthropic``
    ``POST /v1/messages``, the built-in ``openai`` provider ``POST /v1/responses`` (all bundled
    in the OpenCode binary). The launch config (main and title
    model both the served model, its limits, timeouts) is written under ``home`` and passed with
    ``OPENCODE_CONFIG`` as ``freetoken launch`` does; no ``-m``, so the config's ``model`` is what
    OpenCode uses. ``XDG_CONFIG_HOME`` is the installer's prepared config home, so OpenCode finds
    its plugin installed and does not fetch it from the registry. ``workdir`` (the run's working
    directory) must hold no ``opencode.json``: OpenCode would merge it over the launch config.

    Raises:
        ValueError: ``provider`` is not one of ``OPENCODE_PROVIDERS``.
    """
    assert not (workdir / "opencode.json").exists(), f"{workdir} has its own opencode.json"
    if provider == "openai":
        config = _builtin_openai(opencode_config(launch_target(base_url, model)))
    else:
        config = opencode_config(launch_target(base_url, model), provider)
    config.update(autoupdate=False, share="disabled")
    path = home / "freetoken-launch" / "opencode.json"
    write_config(path, config_text(config))
    env = base_env(client, home)
    assert client.config_home is not None, "the OpenCode install has no prepared config home"
    env.update(
        XDG_CONFIG_HOME=str(client.config_home), OPENCODE_DISABLE_MODELS_FETCH="1",
        OPENCODE_DISABLE_AUTOUPDATE="1", OPENCODE_DISABLE_SHARE="1", OPENCODE_DISABLE_LSP_DOWNLOAD="1",
        OPENCODE_DISABLE_DEFAULT_PLUGINS="1", OPENCODE_DISABLE_CLAUDE_CODE="1",
        OPENCODE_DISABLE_EXTERNAL_SKILLS="1",
    )
    env.update(opencode_env(path))
    argv = [str(client.executable), "run", "--pure", "--format", "json", PROMPT]
    return argv, env


def _builtin_openai(config: dict) -> dict:
    """The launch config moved onto OpenCode's built-in ``openai`` provider: same options and
    model, no ``npm`` (the built-in provider brings ``@ai-sdk/openai`` and calls its Responses
    model), model ids ``openai/<model>``."""
    provider = dict(config["provider"]["freetoken"])
    provider.pop("npm")
    provider.pop("name")
    model = config["model"].split("/", 1)[1]
    return {**config, "provider": {"openai": provider}, "model": f"openai/{model}",
            "small_model": f"openai/{model}"}


def openclaw(client: ClientInstall, base_url: str, model: str, home: Path, workdir: Path,
             config_path: Path) -> tuple[list[str], dict[str, str]]:
    """``openclaw agent exec PROMPT --json`` (embedded one-turn run, no gateway) on Node 24.

    The launch config (provider ``freetoken``, ``api: "openai-completions"``, ``reasoning: true``,
    the server's limits, the primary model) is written to ``config_path`` and passed with
    ``OPENCLAW_CONFIG_PATH`` as ``freetoken launch`` does; no ``--model``, so the config's primary
    model is what OpenClaw uses. The tests add the model's request params
    ``chat_template_kwargs.enable_thinking=false`` (the documented switch for Qwen-family thinking
    templates) and ``ignore_eos`` (vLLM extension, sent through OpenClaw's ``extra_body``): OpenClaw
    fails a turn whose reply has no visible text, and the random tiny model otherwise often spends
    its whole reply in reasoning or stops at once.
    """
    config = openclaw_config(launch_target(base_url, model))
    config["update"] = {"checkOnStart": False}
    primary = config["agents"]["defaults"]["model"]["primary"]
    config["agents"]["defaults"]["models"] = {primary: {"params": {
        "chat_template_kwargs": {"enable_thinking": False},
        "extra_body": {"ignore_eos": True},
    }}}
    write_config(config_path, config_text(config))
    env = base_env(client, home)
    env.update(DO_NOT_TRACK="1", OPENCLAW_NO_AUTO_UPDATE="1", CI="1")
    env.update(openclaw_env(config_path))
    argv = [str(client.executable), "agent", "exec", PROMPT, "--cwd", str(workdir), "--json", "--timeout", "240"]
    return argv, env


def mini_swe_agent(client: ClientInstall, base_url: str, model: str, home: Path, trajectory: Path,
                   step_limit: int) -> tuple[list[str], dict[str, str]]:
    """``mini -y --exit-immediately`` through litellm (``openai/<model>``, non-streaming chat), with the
    launch settings (model, base URL and key as environment variables, cost tracking errors ignored).

    ``agent.step_limit`` bounds the run: the random tiny model never returns the tool call the agent
    requires, so every step ends in mini's format-error feedback and the run exits with
    ``LimitsExceeded`` after ``step_limit`` model calls. ``MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT=1``:
    a failed call is not retried (mini retries 10 times with backoff by default), so a server error
    ends the run at once instead of hiding behind a retry.
    """
    env = base_env(client, home)
    env.update(mini_swe_agent_env(launch_target(base_url, model)))
    env.update(MSWEA_GLOBAL_CONFIG_DIR=str(home / "mswea"), MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT="1")
    argv = [str(client.executable), "-y", "--exit-immediately", "-t", PROMPT, "-c", "mini.yaml",
            "-c", f"agent.step_limit={step_limit}", "-o", str(trajectory)]
    return argv, env


def codex(client: ClientInstall, base_url: str, model: str, home: Path,
          workdir: Path) -> tuple[list[str], dict[str, str]]:
    """``codex <launch -c overrides> exec --json`` (one non-interactive turn) against
    ``base_url`` through the Responses API.

    The launch overrides (provider ``freetoken``, ``wire_api = "responses"``, key from
    ``FREETOKEN_API_KEY``, the server's limits) come first, as ``freetoken launch codex`` puts
    them; then the tests' own: ``--strict-config`` (an override Codex does not know fails the
    run instead of being ignored), no retries of a failed request or stream (a server error
    ends the run at once instead of hiding behind a retry), a fresh ``CODEX_HOME`` under
    ``home`` (no login, no user config), ``--skip-git-repo-check`` (``workdir`` is no git
    repository), a read-only sandbox, ``--ephemeral`` (no session files) and ``--json`` (one
    JSON event per line on stdout).
    """
    target = launch_target(base_url, model)
    env = base_env(client, home)
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    env.update(codex_env(target), CODEX_HOME=str(codex_home))
    argv = [str(client.executable), "--strict-config", *codex_args(target),
            "-c", "model_providers.freetoken.request_max_retries=0",
            "-c", "model_providers.freetoken.stream_max_retries=0",
            "exec", "--skip-git-repo-check", "--sandbox", "read-only", "--ephemeral", "--json",
            "--cd", str(workdir), PROMPT]
    return argv, env
