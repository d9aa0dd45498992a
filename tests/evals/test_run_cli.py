"""``evals/run.py`` as a user meets it: checks made before any request (traces, --out, endpoint,
API key, option values), the whole-request timeout, Ctrl-C and SIGTERM, the warm-start rule of
non-FreeToken servers, FreeToken's MoE settings, the engine paragraph of summary.md and the plots'
turn ticks. Against the recording stub server (tests/evals/stub_server.py), no model."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from evals.replay.plots import turn_figure
from evals.replay.synthetic import write_synthetic_traces
from evals.run import main as run_main
from tests.evals.stub_server import StubServer, scripted_prompt_tokens

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_traces(tmp_path_factory.mktemp("synthetic"))


@pytest.fixture(autouse=True)
def _no_env_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FREETOKEN_API_KEY", raising=False)


def _argv(url: str, traces: Path | str, out: Path, *extra: str, workload: str = "W1") -> list[str]:
    return ["--workload", workload, "--endpoint", url, "--traces", str(traces), "--out", str(out),
            "--no-progress", *extra]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_explicit_traces_folder_must_exist(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    with StubServer() as stub:
        assert run_main(_argv(stub.url, tmp_path / "missing", tmp_path / "o1")) == 2
        assert run_main(_argv(stub.url, tmp_path / "file", tmp_path / "o2")) == 2
        assert run_main(_argv(stub.url, tmp_path / "empty", tmp_path / "o3")) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"run: --traces {tmp_path}/missing: no such folder",
        f"run: --traces {tmp_path}/file: not a folder",
        f"run: W1: none of W1_math_aime under {tmp_path}/empty",
    ]
    assert stub.state.gets == [] and stub.state.log == []  # nothing was sent


def test_explicit_synthetic_traces_are_named_everywhere(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    with StubServer(freetoken=False) as stub:
        assert run_main(_argv(stub.url, "synthetic", tmp_path / "o", "--limit-turns", "2")) == 0
    captured = capsys.readouterr()
    assert "replaying the built-in SYNTHETIC set" in captured.err
    assert "; traces: synthetic; wrote " in captured.out
    summary = json.loads((tmp_path / "o/summary.json").read_text())
    assert (summary["traces"], summary["traces_source"], summary["interrupted"]) == (
        "synthetic", "synthetic", False)


def test_out_is_checked_before_any_request(tmp_path: Path, traces: Path,
                                           capsys: pytest.CaptureFixture) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    with StubServer() as stub:
        assert run_main(_argv(stub.url, traces, afile)) == 2
        assert run_main(_argv(stub.url, traces, afile / "sub" / "run")) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"run: --out {afile}: exists and is not a folder",
        f"run: --out {afile}/sub/run: {afile} is not a folder",
    ]
    assert stub.state.gets == [] and stub.state.log == []


def test_endpoint_is_normalised_and_checked(tmp_path: Path, traces: Path,
                                            capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run_main(_argv("ftp://127.0.0.1:1", traces, tmp_path / "o"))
    assert exit_info.value.code == 2
    assert ("error: --endpoint 'ftp://127.0.0.1:1' is not an http:// or https:// URL with a host"
            in capsys.readouterr().err)

    port = _free_port()
    assert run_main(_argv(f"http://127.0.0.1:{port}", traces, tmp_path / "o")) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"run: cannot reach http://127.0.0.1:{port} (")
    assert err.endswith("); is the server running there?\n")

    with StubServer(models_status=404) as stub:
        assert run_main(_argv(stub.url, traces, tmp_path / "o")) == 2
    assert capsys.readouterr().err == (
        f"run: {stub.url}/v1/models answered HTTP 404: <html>no such page</html>; not an "
        "OpenAI-compatible server (it needs GET /v1/models)\n")
    assert stub.state.log == []

    with StubServer(freetoken=False) as stub:
        assert run_main(_argv(stub.url + "/v1/", traces, tmp_path / "ok", "--limit-turns", "1")) == 0
    summary = json.loads((tmp_path / "ok/summary.json").read_text())
    assert summary["endpoint"] == stub.url and summary["model"] == "stub-model"
    assert [e["path"] for e in stub.state.log] == ["/v1/chat/completions"]


def test_api_key_is_required_up_front_and_read_from_the_environment(
        tmp_path: Path, traces: Path, capsys: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    with StubServer(api_key="s3cret") as stub:
        assert run_main(_argv(stub.url, traces, tmp_path / "a")) == 2
        assert run_main(_argv(stub.url, traces, tmp_path / "b", "--api-key", "wrong")) == 2
        assert stub.state.log == []
        monkeypatch.setenv("FREETOKEN_API_KEY", "s3cret")
        assert run_main(_argv(stub.url, traces, tmp_path / "c", "--limit-turns", "2")) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (f"run: {stub.url}/v1/models answered HTTP 401: invalid API key; the endpoint "
                      "wants an API key: pass --api-key or set FREETOKEN_API_KEY")
    assert err[1] == err[0] + " (the key given was refused)"
    sent = {k.lower(): v for k, v in stub.state.log[0]["headers"].items()}
    assert sent["authorization"] == "Bearer s3cret" and sent["x-api-key"] == "s3cret"
    summary = json.loads((tmp_path / "c/summary.json").read_text())
    assert summary["n_turns"] == 2 and summary["n_failed"] == 0
    assert summary["engine"]["expert_hits"] == 6  # /metrics was scraped with the key


@pytest.mark.parametrize("value", ["0", "-1", "abc", "nan"])
def test_timeout_must_be_positive(value: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run_main(["--workload", "W1", "--endpoint", "http://x", "--timeout", value])
    assert exit_info.value.code == 2
    assert "argument --timeout: " in capsys.readouterr().err


def test_timeout_bounds_the_whole_request(tmp_path: Path, traces: Path) -> None:
    # 40 tokens 0.03 s apart: no gap between events reaches the timeout, the whole request does
    with StubServer(freetoken=False, token_delay_s=0.03) as stub:
        code = run_main(_argv(stub.url, traces, tmp_path / "o", "--limit-turns", "2",
                              "--w1-max-tokens", "40", "--timeout", "0.4"))
    assert code == 1
    records = [json.loads(t) for t in (tmp_path / "o/turns.jsonl").read_text().splitlines()]
    for r in records:
        assert r["error"] == "timed out after 0.4 s (whole request)" and r["status"] == 200
        assert 0.4 <= r["total_s"] < 1.0 and r["ttft_s"] is not None
    assert json.loads((tmp_path / "o/summary.json").read_text())["n_failed"] == 2


def test_help_shows_defaults(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        run_main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for default in ("(default: 600)", "(W1; default: 512)", "(default: 1.0, the APIs' default)",
                    "(default: $FREETOKEN_API_KEY, else none)", "(default: all)",
                    "(default: replay-out/<workload>-<label>)"):
        assert default in text


def _interrupt_a_run(tmp_path: Path, traces: Path, signum: int
                     ) -> tuple[subprocess.Popen, str, str, Path]:
    """Start evals/run.py in a subprocess against the stub, send ``signum`` once two turns are
    in turns.jsonl; returns (process, stdout, stderr, out folder)."""
    out = tmp_path / "o"
    with StubServer(freetoken=False, token_delay_s=0.01) as stub:
        env = {k: v for k, v in os.environ.items() if k != "FREETOKEN_API_KEY"}
        proc = subprocess.Popen(
            [sys.executable, str(REPO_ROOT / "evals/run.py"),
             *_argv(stub.url, traces, out, "--w1-max-tokens", "40")],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        turns = out / "turns.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if turns.is_file() and len(turns.read_text().splitlines()) >= 2:
                break  # lines appear while the run goes on: appended as turns finish
            time.sleep(0.02)
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=60)
    return proc, stdout, stderr, out


@pytest.mark.parametrize(("signum", "status", "cause"), [
    (signal.SIGINT, 130, "Ctrl-C"), (signal.SIGTERM, 143, "SIGTERM")])
def test_ctrl_c_and_sigterm_keep_the_finished_turns(tmp_path: Path, traces: Path, signum: int,
                                                    status: int, cause: str) -> None:
    proc, stdout, stderr, out = _interrupt_a_run(tmp_path, traces, signum)
    assert proc.returncode == status, stderr
    assert "Traceback" not in stderr
    summary = json.loads((out / "summary.json").read_text())
    done = summary["n_turns"]
    assert summary["interrupted"] is True and summary["n_planned"] == 8 and 2 <= done < 8
    assert summary["interrupted_by"] == cause
    assert summary["engine"] is None and summary["n_failed"] == 0
    records = [json.loads(t) for t in (out / "turns.jsonl").read_text().splitlines()]
    assert [r["index"] for r in records] == list(range(done))
    assert all(r["output_tokens"] == 40 for r in records)
    assert (f"run: interrupted ({cause}) after {done} of 8 turns; the finished turns are in "
            f"{out}/turns.jsonl") in stderr
    assert "; INTERRUPTED; wrote " in stdout
    md = (out / "summary.md").read_text()
    assert f"**Interrupted** ({cause}) after {done} of 8 planned turns" in md
    assert all((out / name).is_file() for name in ("ttft.png", "decode_tps.png", "reuse.png"))


def test_summary_md_labels_engine_totals(tmp_path: Path, traces: Path) -> None:
    with StubServer() as stub:
        assert run_main(_argv(stub.url, traces, tmp_path / "o", "--limit-turns", "3",
                              workload="W2")) == 0
    md = (tmp_path / "o/summary.md").read_text()
    assert ("- counters, deltas over the run: expert_hits 9, expert_misses 3, checkpoint_saves 6, "
            "checkpoint_loads 3, requests_added 3\n") in md
    assert "- expert_hit_rate 0.750 (hits / (hits + misses) over the run)\n" in md
    assert "- prefix cache held at the end of the run (not deltas): checkpoints_device 4\n" in md


@pytest.mark.parametrize(("fraction", "warm"), [(0.25, False), (0.75, True)])
def test_other_servers_are_judged_warm_by_the_first_turn(
        tmp_path: Path, traces: Path, capsys: pytest.CaptureFixture, fraction: float,
        warm: bool) -> None:
    with StubServer(freetoken=False, reuse_fraction=fraction) as stub:
        assert run_main(_argv(stub.url, traces, tmp_path / "o", "--limit-turns", "2")) == 0
    assert "/v1/freetoken/memory" in stub.state.gets  # asked, answered 404
    prompt = scripted_prompt_tokens(stub.bodies[0])
    evidence = (f"first turn reused {int(prompt * fraction)} of {prompt} prompt tokens "
                f"({'>=' if warm else '<'} 50%)")
    summary = json.loads((tmp_path / "o/summary.json").read_text())
    assert {k: summary[k] for k in ("warm_start", "warm_start_rule", "warm_start_evidence",
                                    "first_turn_warm", "server_moe")} == {
        "warm_start": warm, "warm_start_rule": "first_turn_reuse", "warm_start_evidence": evidence,
        "first_turn_warm": warm, "server_moe": None}
    md = (tmp_path / "o/summary.md").read_text()
    captured = capsys.readouterr()
    if warm:
        assert f"** (evidence: {evidence}).\n" in md and "\n**WARM: the server had" in md
        assert "; WARM start; wrote " in captured.out
        assert captured.err == (f"run: WARM: the server had already served requests before this "
                                f"run; its TTFT/reuse are not a cold-start measurement "
                                f"({evidence})\n")
    else:
        assert f"\nCold start (evidence: {evidence}).\n" in md and "WARM" not in md
        assert "WARM" not in captured.out + captured.err


def test_freetoken_moe_settings_are_recorded(tmp_path: Path, traces: Path) -> None:
    memory = {"backend": "offload", "policy": "lru", "device": "cpu",
              "expert_cache": {"slots": 8, "bytes": 4096, "expert_format": "q4g",
                               "cpu_activations": "q8", "memory_floor_bytes": None}}
    with StubServer(memory=memory) as stub:
        assert run_main(_argv(stub.url, traces, tmp_path / "o", "--limit-turns", "1")) == 0
    summary = json.loads((tmp_path / "o/summary.json").read_text())
    assert summary["server_moe"] == memory
    md = (tmp_path / "o/summary.md").read_text()
    assert ("\nServer MoE settings (`/v1/freetoken/memory`): backend `offload`, expert_format "
            "`q4g`, cpu_activations `q8`.\n") in md


def test_turn_plots_have_integer_ticks() -> None:
    fig = turn_figure([0, 1, 2], [0.5, 0.7, 0.2], "TTFT (s)", "W1 x")
    try:
        fig.canvas.draw()
        ticks = list(fig.axes[0].get_xticks())
    finally:
        plt.close(fig)
    assert ticks and all(float(t).is_integer() for t in ticks)
