"""``evals/run_swe.py`` as a user meets it: the time limit as an agent outcome, Ctrl-C (the
agent's process group killed, the temporary copy removed, a partial report, exit 130), the checks
made before the agent starts (endpoint, key, ``--out``) and ``--help``. With a fake ``mini`` and
the stub server of ``tests/evals/swe_fixtures.py``, no model."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evals import run_swe
from evals.swe.agent import run_agent
from tests.evals.swe_fixtures import StubServer, write_fake_mini

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def stub():
    server = StubServer().start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _no_env_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FREETOKEN_API_KEY", raising=False)


def _run(stub_url: str, mini: Path, out: Path, *extra: str) -> tuple[int, dict]:
    code = run_swe.main(["--endpoint", f"{stub_url}/v1/", "--agent-bin", str(mini), "--out", str(out),
                         "--step-limit", "4", *extra])
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    return code, report


def test_run_kills_an_agent_at_the_time_limit(stub: StubServer, tmp_path: Path) -> None:
    mini, seen_path = write_fake_mini(tmp_path / "bin", "sleep")
    code, report = _run(stub.url, mini, tmp_path / "out", "--timeout", "1.5")
    assert code == 0  # an agent outcome, not an infrastructure failure
    agent = report["agent"]
    assert agent["timed_out"] and agent["exit_code"] is None and not agent["interrupted"]
    assert agent["exit_status"] == "killed (timeout)"
    assert agent["outcome"] == f"timed out after {agent['seconds']:.0f} s (killed at the time limit)"
    assert agent["seconds"] >= 1.5
    assert report["infrastructure_errors"] == [] and report["status"] == "ok"
    seen = json.loads(seen_path.read_text())
    assert not _alive(seen["pid"]) and not _alive(seen["child"])
    md = (tmp_path / "out" / "report.md").read_text()
    assert ("- harness exit status: `killed (timeout)`; process exit code: -; the harness "
            f"{agent['outcome']}\n") in md


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its reaper counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _wait_dead(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def test_ctrl_c_kills_the_agent_group_and_writes_a_partial_report(stub: StubServer, tmp_path: Path) -> None:
    mini, seen_path = write_fake_mini(tmp_path / "bin", "sleep")
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "FREETOKEN_API_KEY"}
    proc = subprocess.Popen([sys.executable, str(REPO_ROOT / "evals" / "run_swe.py"), "--endpoint", stub.url,
                             "--agent-bin", str(mini), "--out", str(out)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not seen_path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and f"partial report in {out}" in stderr
    seen = json.loads(seen_path.read_text())
    assert _wait_dead(seen["pid"]) and _wait_dead(seen["child"])
    assert not Path(seen["cwd"]).exists()  # the temporary copy is gone
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "interrupted" and not report["ok"]
    assert report["agent"]["exit_status"] == "killed (interrupted)" and report["agent"]["interrupted"]
    assert report["infrastructure_errors"] == []
    assert report["tests"]["run"]["summary"] == "not run (the run was interrupted)"
    assert "- run: INTERRUPTED (Ctrl-C)" in (out / "report.md").read_text()


def test_run_agent_kills_the_group_when_waiting_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mini, seen_path = write_fake_mini(tmp_path / "bin", "sleep")
    real_wait = subprocess.Popen.wait
    calls = []

    def failing_wait(self, timeout=None):  # noqa: ANN001 - Popen.wait's signature
        calls.append(timeout)
        if len(calls) == 1:
            while not seen_path.exists():
                time.sleep(0.05)
            raise RuntimeError("boom")
        return real_wait(self, timeout)

    monkeypatch.setattr(subprocess.Popen, "wait", failing_wait)
    with pytest.raises(RuntimeError, match="boom"):
        run_agent([str(mini), "-o", str(tmp_path / "t.json"), "-t", "x"],
                  {"PATH": "/usr/bin:/bin", "MSWEA_MODEL_NAME": "openai/m", "OPENAI_BASE_URL": "http://127.0.0.1:9",
                   "OPENAI_API_KEY": "k"}, tmp_path, tmp_path / "agent.log", 600.0)
    seen = json.loads(seen_path.read_text())
    assert _wait_dead(seen["pid"]) and _wait_dead(seen["child"])


def test_run_reads_the_key_from_the_environment(stub: StubServer, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FREETOKEN_API_KEY", "from-env")
    mini, seen_path = write_fake_mini(tmp_path / "bin", "noop")
    code, _ = _run(stub.url, mini, tmp_path / "out")
    assert code == 0
    assert json.loads(seen_path.read_text())["env"]["OPENAI_API_KEY"] == "from-env"
    models = [r for r in stub.received if r.path == "/v1/models"]
    sent = {k.lower(): v for k, v in models[0].headers.items()}
    assert sent["authorization"] == "Bearer from-env" and sent["x-api-key"] == "from-env"


def test_run_checks_endpoint_and_out_before_starting(stub: StubServer, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    mini, seen_path = write_fake_mini(tmp_path / "bin", "noop")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert run_swe.main(["--endpoint", f"http://127.0.0.1:{port}", "--agent-bin", str(mini),
                         "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot reach http://127.0.0.1:{port} (")
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert run_swe.main(["--endpoint", stub.url, "--agent-bin", str(mini), "--out", str(afile)]) == 2
    assert capsys.readouterr().err == f"error: --out {afile}: exists and is not a folder\n"
    with pytest.raises(SystemExit) as exit_info:
        run_swe.main(["--endpoint", "localhost:8000"])
    assert exit_info.value.code == 2
    assert "is not an http:// or https:// URL with a host" in capsys.readouterr().err
    assert not seen_path.exists() and stub.posts() == []


def test_help_shows_defaults(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        run_swe.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for default in ("(default: 10)", "(default: 1800)", "(default: $FREETOKEN_API_KEY, else 'freetoken')",
                    "(default: the one GET /v1/models lists)"):
        assert default in text
