"""Fixtures of the real-client acceptance tests: installed clients, one live server per session.

The server (``freetoken serve``, embedded tiny qwen3_next, ``--max-output-tokens 48``) runs behind the
recording relay of ``tap.py``; clients are pointed at the relay. Artifacts (every exchange, client
output, server log) go to ``$FREETOKEN_CLIENTS_ARTIFACTS`` or a session temp folder, and a summary of
what each client sent is printed at the end of the session.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from . import install
from .runner import SUMMARIES
from .server import ServerProcess
from .tap import Tap

MAX_OUTPUT_TOKENS = 48
# Families besides the default one that each client must also complete a turn against.
FAMILIES = ("qwen3_5_moe", "glm4_moe", "gpt_oss")
_ARTIFACTS: list[Path] = []


@dataclass(frozen=True)
class Live:
    """The live server, the relay in front of it, and where run artifacts go.

    ``base_url`` is the relay's ``http://127.0.0.1:<port>``: what clients are configured with.
    """

    server: ServerProcess
    tap: Tap
    artifacts: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.tap.port}"

    @property
    def model(self) -> str:
        return self.server.served_model_name


@pytest.fixture(scope="session")
def artifacts_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``$FREETOKEN_CLIENTS_ARTIFACTS`` (created) or a fresh session temp folder."""
    configured = os.environ.get("FREETOKEN_CLIENTS_ARTIFACTS")
    folder = Path(configured) if configured else tmp_path_factory.mktemp("clients-artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    _ARTIFACTS.append(folder)
    return folder


@pytest.fixture(scope="session")
def live(artifacts_dir: Path) -> Iterator[Live]:
    """Start ``freetoken serve`` and the relay once per session; stop both at the end."""
    server = ServerProcess.start(artifacts_dir / "server.log", max_output_tokens=MAX_OUTPUT_TOKENS)
    tap = Tap(server.port)
    try:
        tap.start()
        yield Live(server, tap, artifacts_dir)
    finally:
        tap.stop()
        server.stop()


@pytest.fixture(scope="session", params=FAMILIES)
def family_live(request: pytest.FixtureRequest, artifacts_dir: Path) -> Iterator[Live]:
    """A second server (and relay) on the tiny checkpoint of each family in ``FAMILIES``."""
    from freetoken.models.tiny import cached_tiny

    family = request.param
    folder = artifacts_dir / family
    folder.mkdir(exist_ok=True)
    server = ServerProcess.start(folder / "server.log", max_output_tokens=MAX_OUTPUT_TOKENS,
                                 extra_args=("--model", str(cached_tiny(family))))
    tap = Tap(server.port)
    try:
        tap.start()
        yield Live(server, tap, folder)
    finally:
        tap.stop()
        server.stop()


def _installed(name: str) -> install.ClientInstall:
    try:
        return install.install(name)
    except install.InstallError as exc:
        pytest.fail(f"installing {name} failed (npm/PyPI must be reachable, or the cache pre-filled): {exc}")


@pytest.fixture(scope="session")
def claude_code_client() -> install.ClientInstall:
    """Claude Code, installed (or found) under the clients cache."""
    return _installed("claude-code")


@pytest.fixture(scope="session")
def opencode_client() -> install.ClientInstall:
    """OpenCode and its prepared config home."""
    return _installed("opencode")


@pytest.fixture(scope="session")
def openclaw_client() -> install.ClientInstall:
    """OpenClaw with its Node 24."""
    return _installed("openclaw")


@pytest.fixture(scope="session")
def mini_swe_agent_client() -> install.ClientInstall:
    """mini-swe-agent in its own venv."""
    return _installed("mini-swe-agent")


@pytest.fixture(scope="session")
def codex_client() -> install.ClientInstall:
    """Codex CLI with its native binary."""
    return _installed("codex")


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001 - pytest hook signature
    """Print what each client sent (one block per run) and where the artifacts are."""
    if not SUMMARIES:
        return
    terminalreporter.section("real clients: what each one sent")
    for block in SUMMARIES:
        terminalreporter.write_line(block)
    for folder in _ARTIFACTS:
        terminalreporter.write_line(f"artifacts (exchanges, client output, server log): {folder}")
