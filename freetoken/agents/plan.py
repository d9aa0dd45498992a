"""Everything one launch does, computed without side effects: the child environment, the config file
(path and text) and the argv.

``plan_launch`` is pure over its arguments (the caller's environment is passed in, the executable is
looked up on that environment's ``PATH``, then in the clients cache it names), so ``--dry-run``
prints exactly what a real launch would do, and tests and ``tests/clients`` build the same
settings.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from freetoken.agents import claude_code, codex, mini_swe_agent, openclaw, opencode
from freetoken.agents.discover import is_loopback
from freetoken.agents.environment import child_environment, proxy_bypass
from freetoken.agents.installed import find_cached
from freetoken.agents.target import Target


@dataclass(frozen=True)
class AgentSpec:
    """One launchable agent.

    ``settings(target, config_path)`` returns the environment variables to set and the config
    document to write (None for agents configured by environment alone); ``config_file`` is the
    file name in the launch config folder (None: no file).
    """

    name: str
    executable: str
    install_hint: str
    config_file: str | None
    settings: Callable[[Target, Path | None], tuple[dict[str, str], dict | None]]


def _claude(target: Target, _path: Path | None) -> tuple[dict[str, str], None]:
    return claude_code.claude_code_env(target), None


def _opencode(target: Target, path: Path | None) -> tuple[dict[str, str], dict]:
    assert path is not None
    return opencode.opencode_env(path), opencode.opencode_config(target)


def _openclaw(target: Target, path: Path | None) -> tuple[dict[str, str], dict]:
    assert path is not None
    return openclaw.openclaw_env(path), openclaw.openclaw_config(target)


def _mini(target: Target, _path: Path | None) -> tuple[dict[str, str], None]:
    return mini_swe_agent.mini_swe_agent_env(target), None


def _codex(target: Target, _path: Path | None) -> tuple[dict[str, str], None]:
    return codex.codex_env(target), None


AGENTS: dict[str, AgentSpec] = {
    "claude": AgentSpec("claude", claude_code.EXECUTABLE, claude_code.INSTALL_HINT, None, _claude),
    "opencode": AgentSpec("opencode", opencode.EXECUTABLE, opencode.INSTALL_HINT, opencode.CONFIG_FILE,
                          _opencode),
    "openclaw": AgentSpec("openclaw", openclaw.EXECUTABLE, openclaw.INSTALL_HINT, openclaw.CONFIG_FILE,
                          _openclaw),
    "mini-swe-agent": AgentSpec("mini-swe-agent", mini_swe_agent.EXECUTABLE, mini_swe_agent.INSTALL_HINT,
                                None, _mini),
    "codex": AgentSpec("codex", codex.EXECUTABLE, codex.INSTALL_HINT, None, _codex),
}


@dataclass(frozen=True)
class LaunchPlan:
    """One launch, fully resolved.

    ``argv[0]`` is the executable's path when it was found on ``PATH`` or in the clients cache
    (``executable_found``), else its bare name. ``settings`` are the variables the launch sets
    (display order), ``cleared`` the cloud credentials it removes, ``env`` the complete child
    environment. ``config_text`` is written to ``config_path`` before the agent starts (both None
    for env-only agents).
    """

    agent: str
    target: Target
    argv: tuple[str, ...]
    executable_found: bool
    settings: dict[str, str]
    cleared: tuple[str, ...]
    env: dict[str, str]
    config_path: Path | None
    config_text: str | None


def config_dir(agent: str, environ: Mapping[str, str]) -> Path:
    """``$XDG_CONFIG_HOME/freetoken/launch/<agent>``, else ``$HOME/.config/freetoken/launch/<agent>``:
    a folder FreeToken owns, so no user config file is ever overwritten. Not created here."""
    base = environ.get("XDG_CONFIG_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".config")
    return Path(base) / "freetoken" / "launch" / agent


def config_text(config: dict) -> str:
    """The file text of a config document: indented JSON (also valid JSON5), newline-terminated."""
    return json.dumps(config, indent=2) + "\n"


def spec_args(agent: str, settings: Mapping[str, str], target: Target) -> tuple[str, ...]:
    """Arguments placed before the user's: Claude Code gets its variables again as
    ``--settings '{"env": {...}}'``, because the ``env`` block of the user's own
    ``~/.claude/settings.json`` (say, an ``ANTHROPIC_BASE_URL``) would otherwise override the
    process environment, while command-line settings rank above user and project settings.
    Codex gets its provider as ``-c`` overrides (they rank above ``~/.codex/config.toml``)."""
    if agent == "codex":
        return codex.codex_args(target)
    if agent != "claude":
        return ()
    return ("--settings", json.dumps({"env": dict(settings)}, separators=(",", ":")))


def plan_launch(agent: str, target: Target, environ: Mapping[str, str], extra_args: list[str] | tuple[str, ...] = (),
                config_folder: Path | None = None) -> LaunchPlan:
    """The launch of ``agent`` against ``target`` from a process whose environment is ``environ``.

    ``extra_args`` follow the executable verbatim. ``config_folder`` defaults to ``config_dir``.
    An agent missing from ``PATH`` is taken from the clients cache (``installed.find_cached``);
    a cached OpenClaw gets its Node 24 first on ``PATH``.
    When the server is on loopback and ``environ`` sets a proxy, its host is added to ``NO_PROXY``.

    Raises:
        KeyError: ``agent`` is not one of ``AGENTS``.
    """
    spec = AGENTS[agent]
    path = (config_folder or config_dir(agent, environ)) / spec.config_file if spec.config_file else None
    settings, config = spec.settings(target, path)
    if is_loopback(target.base_url):
        settings = {**settings, **proxy_bypass(environ, urlsplit(target.base_url).hostname or "")}
    found = shutil.which(spec.executable, path=environ.get("PATH", ""))
    if found is None:
        cached = find_cached(agent, spec.executable, environ)
        if cached is not None:
            found = str(cached.executable)
            if cached.path_dirs:
                lead = os.pathsep.join(str(d) for d in cached.path_dirs)
                settings = {**settings, "PATH": f"{lead}{os.pathsep}{environ.get('PATH', '')}"}
    env, cleared = child_environment(environ, settings)
    argv = (found or spec.executable, *spec_args(agent, settings, target), *extra_args)
    return LaunchPlan(agent, target, argv, found is not None, settings, cleared, env, path,
                      None if config is None else config_text(config))
