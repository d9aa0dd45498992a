"""``freetoken launch`` finds an agent that is not on PATH in the clients cache where
``tests/clients/install.py`` puts it (same folders and stamps, same ``$FREETOKEN_CACHE``), and
runs a cached OpenClaw with the cached Node 24 first on PATH."""

from __future__ import annotations

import json
import os
from pathlib import Path
from unittest import mock

import pytest

from tests.clients import install
from tests.unit.test_agent_launch import (  # noqa: F401 - fixtures
    EXECUTABLES, LIGHT_MAIN, Stub, _dry_run, _expected, _fake_agent, _launch, _lead, stub, user,
)

INSTALLER_NAMES = {"claude": "claude-code", "opencode": "opencode", "openclaw": "openclaw",
                   "mini-swe-agent": "mini-swe-agent", "codex": "codex"}


def _stamp_only(folder: Path, key: str, build, force: bool) -> None:
    """The installer's ``_stamped`` without the npm / pip work: the stamp of a verified install."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / install.STAMP).write_text(json.dumps({"key": key}))


@pytest.fixture
def cache(user: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``$FREETOKEN_CACHE`` of the user, whose clients root the installer fills without npm."""
    monkeypatch.setenv("FREETOKEN_CACHE", str(user / "cache"))
    monkeypatch.setattr(install, "_stamped", _stamp_only)
    return user / "cache"


def _installed(agent: str, dump: Path) -> install.ClientInstall:
    """The installer's result for ``agent``, its executable a fake agent (and a fake node)."""
    with mock.patch.dict(os.environ, PATH=os.defpath):  # mini-swe-agent's venv needs a python3
        client = install.install(INSTALLER_NAMES[agent])
    assert install.clients_root() in client.executable.parents
    client.executable.parent.mkdir(parents=True, exist_ok=True)
    _fake_agent(client.executable.parent, client.executable.name, dump)
    for folder in client.path_dirs:
        folder.mkdir(parents=True, exist_ok=True)
    if agent == "openclaw":
        _fake_agent(client.path_dirs[0], "node", dump)
    return client


@pytest.mark.parametrize("agent", sorted(EXECUTABLES))
def test_dry_run_takes_the_cached_install_off_path(agent: str, stub: Stub, user: Path, cache: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    client = _installed(agent, user / "dump.json")
    got, _ = _dry_run(agent, stub, capsys)
    settings, _, _, _ = _expected(agent, stub.url, user / "home")
    if agent == "openclaw":  # the cached Node 24 first, as the installer's path_dirs say
        settings["PATH"] = os.pathsep.join([*map(str, client.path_dirs), str(user / "bin")])
    assert got["export"] == settings
    assert got["argv"] == [str(client.executable), *_lead(agent, settings, stub.url)]
    assert not [c for c in got["comments"] if "not on PATH" in c]


def test_path_wins_over_the_cache(stub: Stub, user: Path, cache: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    _installed("openclaw", user / "dump.json")
    on_path = _fake_agent(user / "bin", "openclaw", user / "dump.json")
    got, _ = _dry_run("openclaw", stub, capsys)
    assert got["argv"] == [str(on_path)] and "PATH" not in got["export"]


def test_an_unverified_install_is_not_used(stub: Stub, user: Path, cache: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    client = _installed("codex", user / "dump.json")
    (client.executable.parent.parent / install.STAMP).unlink()  # half-done: no stamp
    got, _ = _dry_run("codex", stub, capsys)
    assert got["argv"][0] == "codex"
    assert got["comments"][-1] == "# codex is not on PATH; install it with: npm install -g @openai/codex"


def test_launch_execs_the_cached_openclaw_with_its_node_first(stub: Stub, user: Path, cache: Path) -> None:
    client = _installed("openclaw", user / "dump.json")
    _, status, stderr = _launch(["-c", LIGHT_MAIN], "openclaw", stub.url, "tui")
    assert status == 7, stderr
    dump = json.loads((user / "dump.json").read_text())
    assert dump["argv"] == [str(client.executable), "tui"]
    assert dump["env"]["PATH"].split(os.pathsep) == [*map(str, client.path_dirs), str(user / "bin")]
