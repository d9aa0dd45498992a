"""``evals/run_swe.py``: the recording relay, the bundled task, the report, and real runs.

Without a model: the relay against a stub server (bytes forwarded unchanged, TTFT and tok/s
from known delays and usage), the bundled task (its failing test fails on a fresh copy and passes
with the reference fix), and whole runs of ``run_swe.main`` with a fake ``mini`` (``--agent-bin``)
that calls the stub through the relay. With a model (``clients`` marker): the real mini-swe-agent
against a live ``freetoken serve`` on the embedded tiny model.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
from pathlib import Path

import pytest

from evals import run_swe
from evals.swe.agent import AgentNotFound, find_mini
from evals.swe.calls import CallRecord
from evals.swe.relay import Relay
from evals.swe.task import TASK_DIR, TaskError, copy_repo, load_task, run_tests, tree_diff
from tests.evals.swe_fixtures import (FIX_NEW, FIX_OLD, MODEL, REPLY_DELAY_S, STREAM_EVENTS, USAGE, StubServer,
                                      write_fake_mini)

REPO_ROOT = Path(__file__).resolve().parents[2]
FAILING = "tests/test_stats.py::test_median_even_length"
REFERENCE_DIFF = '''--- a/tally/stats.py
+++ b/tally/stats.py
@@ -23,7 +23,9 @@
     """The middle value of ``values`` once sorted."""
     items = sorted(_numbers(values))
     middle = len(items) // 2
-    return items[middle]
+    if len(items) % 2:
+        return items[middle]
+    return (items[middle - 1] + items[middle]) / 2
 
 
 def spread(values: Iterable[float]) -> float:
'''


@pytest.fixture
def stub():
    server = StubServer().start()
    yield server
    server.stop()


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


# -- the relay -----------------------------------------------------------------------------------

def test_relay_forwards_unchanged_and_times_non_streaming_calls(stub: StubServer) -> None:
    relay = Relay(stub.url)
    relay.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", relay.port, timeout=10)
        bodies = [json.dumps({"model": MODEL, "messages": [{"role": "user", "content": f"q{i}"}]}).encode()
                  for i in range(2)]
        answers = []
        for body in bodies:  # one keep-alive connection, two requests
            conn.request("POST", "/v1/chat/completions", body=body,
                         headers={"Content-Type": "application/json", "Authorization": "Bearer k"})
            resp = conn.getresponse()
            answers.append((resp.status, json.loads(resp.read())))
        conn.request("POST", "/v1/chat/completions", body=iter([bodies[0][:9], bodies[0][9:]]),
                     headers={"Content-Type": "application/json"}, encode_chunked=True)
        chunked = conn.getresponse()
        assert chunked.status == 200
        chunked.read()
        conn.close()
    finally:
        relay.stop()
    assert [r.body for r in stub.posts()] == [bodies[0], bodies[1], bodies[0]]
    assert stub.posts()[0].headers["Authorization"] == "Bearer k"
    assert stub.posts()[0].headers["Accept-Encoding"] == "identity"
    assert [status for status, _ in answers] == [200, 200]
    assert [a["id"] for _, a in answers] == ["chatcmpl-stub-0", "chatcmpl-stub-1"]
    calls = relay.model_calls()
    assert [c.response_id for c in calls] == ["chatcmpl-stub-0", "chatcmpl-stub-1", "chatcmpl-stub-2"]
    for call, (prompt, cached, completion) in zip(calls, USAGE + USAGE[:1]):
        assert (call.status, call.stream, call.model, call.error) == (200, False, MODEL, None)
        assert (call.prompt_tokens, call.cached_tokens, call.output_tokens) == (prompt, cached, completion)
        assert call.finish_reason == "stop" and call.tool_calls == 0
        assert call.total_s >= REPLY_DELAY_S
        assert call.ttft_s == call.total_s  # non-streaming: the first token is seen with the whole answer
        assert call.decode_tps == completion / call.total_s


def test_relay_times_streamed_calls_at_the_first_token(stub: StubServer) -> None:
    relay = Relay(stub.url)
    relay.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", relay.port, timeout=10)
        conn.request("POST", "/v1/chat/completions", body=json.dumps({"model": MODEL, "stream": True}),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        received = resp.read()
        conn.close()
    finally:
        relay.stop()
    assert received == stub.stream_bytes  # the SSE bytes arrive unchanged (re-chunked on the wire)
    [call] = relay.model_calls()
    first_delay = STREAM_EVENTS[0][0] + STREAM_EVENTS[1][0]  # the role-only delta is not a token
    assert call.stream and call.status == 200 and call.response_id == "chatcmpl-s"
    assert call.head_s < first_delay <= call.first_token_s < call.total_s
    assert call.ttft_s == call.first_token_s
    assert (call.prompt_tokens, call.cached_tokens, call.output_tokens, call.finish_reason) == (12, 4, 5, "stop")
    assert call.decode_tps == 4 / (call.total_s - call.first_token_s)


def test_call_record_reads_an_anthropic_stream_split_at_every_byte() -> None:
    events = [
        {"type": "message_start", "message": {"id": "msg_1", "type": "message", "content": [], "usage": {
            "input_tokens": 10, "cache_read_input_tokens": 6, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "t", "name": "x"}},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}},
        {"type": "message_stop"},
    ]
    ends = ["\r\n\r\n", "\n\n"]
    wire = [f"event: {e['type']}\ndata: {json.dumps(e)}{ends[i % 2]}".encode() for i, e in enumerate(events)]
    stream = b"".join(wire)
    record = CallRecord(0, "POST", "/v1/messages", True, "m", started=0.0)
    for at in range(len(stream)):
        record.feed(stream[at:at + 1], float(at))
    record.total_s = float(len(stream))
    first_token_at = len(b"".join(wire[:3])) - 1  # the last byte of the first text delta
    assert record.is_model_call and record.first_token_s == record.ttft_s == first_token_at
    assert (record.response_id, record.prompt_tokens, record.cached_tokens, record.output_tokens) == (
        "msg_1", 16, 6, 9)
    assert (record.finish_reason, record.tool_calls) == ("tool_use", 1)
    assert record.decode_tps == 8 / (len(stream) - first_token_at)


def test_relay_reports_an_unreachable_endpoint_as_502() -> None:
    relay = Relay("http://127.0.0.1:9")  # discard port: nothing listens
    relay.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", relay.port, timeout=10)
        conn.request("POST", "/v1/chat/completions", body=b"{}")
        resp = conn.getresponse()
        body = json.loads(resp.read())
    finally:
        relay.stop()
    [call] = relay.calls
    assert resp.status == 502 and call.status is None
    assert call.error.startswith("upstream unreachable: ConnectionRefusedError")
    assert body == {"error": {"message": call.error, "type": "relay_error"}}


def test_relay_rejects_a_non_http_endpoint() -> None:
    with pytest.raises(ValueError, match=r"endpoint 'ftp://x' is not an http:// or https:// URL with a host"):
        Relay("ftp://x")


# -- the bundled task ----------------------------------------------------------------------------

def test_bundled_task_fails_unmodified_and_passes_with_the_reference_fix(tmp_path: Path) -> None:
    task = load_task()
    assert task.failing_tests == (FAILING,) and task.suite == ("tests",)
    assert "median" in task.issue and "The repository is the current working directory" in task.prompt()
    work = copy_repo(task, tmp_path / "repo")
    assert tree_diff(task.repo, work) == ("", [])
    others = {f"tests/test_stats.py::{name}": "PASSED" for name in
              ("test_mean", "test_median_odd_length", "test_spread", "test_empty_sequence_is_rejected")}
    before = run_tests(sys.executable, work, task.suite + task.failing_tests)
    assert before.rc == 1 and before.summary.startswith("1 failed, 4 passed in ")
    assert before.outcomes == {**others, FAILING: "FAILED"}
    assert not before.all_passed(task.failing_tests) and before.all_passed(tuple(others))

    stats = work / "tally" / "stats.py"
    assert stats.read_text().count(FIX_OLD) == 1
    stats.write_text(stats.read_text().replace(FIX_OLD, FIX_NEW))
    after = run_tests(sys.executable, work, task.suite + task.failing_tests)
    assert after.passed and after.summary.startswith("5 passed in ")
    assert after.outcomes == {**others, FAILING: "PASSED"} and after.all_passed(task.failing_tests)
    assert tree_diff(task.repo, work) == (REFERENCE_DIFF, ["tally/stats.py"])


def test_tree_diff_lists_added_deleted_and_binary_files(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for root in (a, b):
        (root / "__pycache__").mkdir(parents=True)
    (a / "gone.txt").write_text("x\n")
    (b / "new.txt").write_text("y")
    (a / "blob.bin").write_bytes(b"\xff\x00")
    (b / "blob.bin").write_bytes(b"\xfe\x00")
    (b / "__pycache__" / "m.pyc").write_bytes(b"ignored")
    diff, changed = tree_diff(a, b)
    assert changed == ["blob.bin", "gone.txt", "new.txt"]
    assert diff == ("Binary files a/blob.bin and b/blob.bin differ\n"
                    "--- a/gone.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n"
                    "--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1 @@\n+y\n\\ No newline at end of file\n")


def test_load_task_names_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match=f"^{tmp_path}/task.json: no such file"):
        load_task(tmp_path)
    (tmp_path / "task.json").write_text(json.dumps({"name": "t", "repo": "r", "issue": "i.md",
                                                    "failing_tests": [], "suite": []}))
    with pytest.raises(TaskError, match="'failing_tests' must list at least one pytest node id"):
        load_task(tmp_path)


# -- whole runs with a fake mini -----------------------------------------------------------------

def _run(stub_url: str, mini: Path, out: Path, *extra: str) -> tuple[int, dict]:
    code = run_swe.main(["--endpoint", f"{stub_url}/v1/", "--agent-bin", str(mini), "--out", str(out),
                         "--step-limit", "4", *extra])
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    return code, report


def test_run_reports_a_run_that_changes_nothing(stub: StubServer, tmp_path: Path) -> None:
    original = _snapshot(TASK_DIR / "repo")
    mini, seen_path = write_fake_mini(tmp_path / "bin", "noop")
    code, report = _run(stub.url, mini, tmp_path / "out", "--api-key", "sekret")
    assert code == 0, report.get("infrastructure_errors")
    seen = json.loads(seen_path.read_text())
    assert Path(seen["cwd"]) != TASK_DIR / "repo" and (Path(seen["cwd"]).name == "repo")
    assert "agent.step_limit=4" in seen["argv"] and "mini.yaml" in seen["argv"]
    assert seen["argv"][seen["argv"].index("-t") + 1] == load_task().prompt()
    env = seen["env"]
    assert env["MSWEA_MODEL_NAME"] == f"openai/{MODEL}" and env["OPENAI_API_KEY"] == "sekret"
    assert env["OPENAI_BASE_URL"].startswith("http://127.0.0.1:") and env["OPENAI_BASE_URL"].endswith("/v1")
    assert (env["MSWEA_COST_TRACKING"], env["LITELLM_LOCAL_MODEL_COST_MAP"], env["MSWEA_CONFIGURED"]) == (
        "ignore_errors", "True", "true")
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)
    assert _snapshot(TASK_DIR / "repo") == original  # the agent worked in a copy

    assert report["ok"] and report["infrastructure_errors"] == []
    assert (report["endpoint"], report["model"], report["step_limit"]) == (stub.url, MODEL, 4)
    agent = report["agent"]
    assert (agent["exit_status"], agent["exit_code"], agent["timed_out"], agent["api_calls"], agent["version"]) == (
        "LimitsExceeded", 0, False, 2, "fake-1.0")
    assert [(s["response_id"], s["interrupt"], s["content"]) for s in report["steps"]] == [
        ("chatcmpl-stub-0", "FormatError", "reply 0"), ("chatcmpl-stub-1", "FormatError", "reply 1")]
    calls = report["calls"]
    assert [(c["step"], c["status"], c["prompt_tokens"], c["cached_tokens"], c["output_tokens"]) for c in calls] == [
        (0, 200, *USAGE[0]), (1, 200, *USAGE[1])]
    assert all(c["ttft_s"] >= REPLY_DELAY_S and c["decode_tps"] == c["output_tokens"] / c["total_s"] for c in calls)
    totals = report["totals"]
    assert (totals["model_calls"], totals["prompt_tokens"], totals["cached_tokens"], totals["output_tokens"]) == (
        2, 640, 296, 18)
    assert totals["ttft_max_s"] == max(c["ttft_s"] for c in calls)
    assert totals["decode_tps_mean"] == pytest.approx(sum(c["decode_tps"] for c in calls) / 2)
    assert report["patch"] == {"files_changed": [], "diff": ""}
    tests = report["tests"]
    assert tests["failing_tests"] == {FAILING: "FAILED"} and tests["run"]["rc"] == 1
    assert (tests["failing_tests_pass"], tests["suite_passes"], tests["resolved"]) == (False, False, False)
    out = tmp_path / "out"
    trajectory = json.loads((out / "trajectory.json").read_text())
    assert trajectory["info"]["exit_status"] == "LimitsExceeded" and len(trajectory["messages"]) == 5
    md = (out / "report.md").read_text()
    assert "- harness exit status: `LimitsExceeded`; process exit code: 0" in md
    assert "- resolved: **no** (failing tests: test_median_even_length FAILED; suite: 1 failed, 4 passed in " in md
    row = f"| 0 | 1 | 200 | 300 | 0 | 7 | {calls[0]['ttft_s']:.3f} | {calls[0]['decode_tps']:.1f} | stop | 0 |"
    assert row in md
    assert "(the agent changed no file)" in md and (out / "patch.diff").read_text() == ""


def test_run_reports_a_fix_that_makes_the_test_pass(stub: StubServer, tmp_path: Path) -> None:
    mini, _ = write_fake_mini(tmp_path / "bin", "fix")
    code, report = _run(stub.url, mini, tmp_path / "out")
    assert code == 0
    assert report["agent"]["exit_status"] == "Submitted"
    assert report["steps"][0]["commands"] == ["sed -i ... tally/stats.py"] and report["steps"][0]["interrupt"] is None
    assert report["patch"] == {"files_changed": ["tally/stats.py"], "diff": REFERENCE_DIFF}
    assert report["tests"]["resolved"] and report["tests"]["failing_tests"] == {FAILING: "PASSED"}
    assert report["tests"]["run"]["summary"].startswith("5 passed in ")
    assert (tmp_path / "out" / "patch.diff").read_text() == REFERENCE_DIFF
    assert "- resolved: **yes**" in (tmp_path / "out" / "report.md").read_text()


def test_run_reports_an_agent_crash_as_an_infrastructure_failure(stub: StubServer, tmp_path: Path) -> None:
    mini, _ = write_fake_mini(tmp_path / "bin", "crash")
    code, report = _run(stub.url, mini, tmp_path / "out")
    assert code == 1 and not report["ok"]
    errors = report["infrastructure_errors"]
    assert errors[0] == "the agent exited with code 3 (see agent.log)"
    assert errors[1].startswith("no trajectory: FileNotFoundError: ")
    assert len(errors) == 2 and report["agent"]["exit_status"] is None
    assert "Traceback: fake crash" in (tmp_path / "out" / "agent.log").read_text()
    assert "- run: INFRASTRUCTURE FAILURE" in (tmp_path / "out" / "report.md").read_text()


def test_run_reports_http_errors_of_the_endpoint(tmp_path: Path) -> None:
    stub = StubServer(fail_status=500).start()
    try:
        mini, _ = write_fake_mini(tmp_path / "bin", "noop")
        code, report = _run(stub.url, mini, tmp_path / "out")
    finally:
        stub.stop()
    assert code == 1
    assert report["infrastructure_errors"][0] == "the agent exited with code 1 (see agent.log)"
    assert "model call 0 (POST /v1/chat/completions) answered HTTP 500" in report["infrastructure_errors"]
    assert report["totals"]["answered_2xx"] == 0 and report["totals"]["ttft_mean_s"] is None


def test_run_cannot_start_without_an_agent_or_a_known_model(stub: StubServer, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture) -> None:
    assert run_swe.main(["--endpoint", stub.url, "--agent-bin", str(tmp_path / "nope"), "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"error: --agent-bin {tmp_path / 'nope'}: not an executable file\n"
    mini, _ = write_fake_mini(tmp_path / "bin", "noop")
    assert run_swe.main(["--endpoint", stub.url, "--agent-bin", str(mini), "--model", "other"]) == 2
    assert capsys.readouterr().err == (f"error: model 'other' is not served by {stub.url} "
                                       f"(it serves: {MODEL})\n")
    assert stub.posts() == []


def test_find_mini_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FREETOKEN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(AgentNotFound) as err:
        find_mini()
    assert str(err.value) == (
        f"mini-swe-agent's `mini` was not found (looked in {tmp_path}/cache/clients/mini-swe-agent-*/venv/bin "
        "and on PATH); install it with `python -m tests.clients.install mini-swe-agent` from the repository "
        "root (a venv under ~/.cache/freetoken/clients), or `pip install mini-swe-agent`, or pass --agent-bin PATH")
    cached = tmp_path / "cache" / "clients" / "mini-swe-agent-2.4.6" / "venv" / "bin" / "mini"
    cached.parent.mkdir(parents=True)
    cached.write_text("#!/bin/sh\n")
    cached.chmod(0o755)
    assert find_mini() == cached


# -- the real agent against a live server --------------------------------------------------------

@pytest.mark.clients
def test_real_mini_swe_agent_against_freetoken_serve(tmp_path: Path) -> None:
    """The CLI as a user runs it: mini-swe-agent 2.4.6 on the tiny random model, step limit 2.

    The random model returns no tool call, so both steps are format errors and mini stops at the
    step limit (exit status ``LimitsExceeded``, exit code 0); the run itself must still be ok.
    """
    from tests.clients.install import InstallError, install
    from tests.clients.server import ServerProcess

    try:
        mini = install("mini-swe-agent")
    except InstallError as exc:
        pytest.fail(f"installing mini-swe-agent failed (PyPI must be reachable, or the cache pre-filled): {exc}")
    server = ServerProcess.start(tmp_path / "server.log", max_output_tokens=48)
    try:
        out = tmp_path / "out"
        proc = subprocess.run([sys.executable, str(REPO_ROOT / "evals" / "run_swe.py"), "--endpoint",
                               server.base_url, "--step-limit", "2", "--out", str(out), "--agent-bin",
                               str(mini.executable), "--timeout", "600"],
                              cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=900)
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stdout[-3000:]
    report = json.loads((out / "report.json").read_text())
    trajectory = json.loads((out / "trajectory.json").read_text())
    assert report["ok"] and report["model"] == server.served_model_name
    agent = report["agent"]
    assert (agent["name"], agent["version"], agent["exit_code"]) == ("mini-swe-agent", "2.4.6", 0)
    assert agent["exit_status"] == trajectory["info"]["exit_status"]
    assert agent["api_calls"] == trajectory["info"]["model_stats"]["api_calls"] == 2
    calls = [c for c in report["calls"] if c["model_call"]]
    assert len(calls) == 2 and [c["step"] for c in calls] == [0, 1]
    assert [c["response_id"] for c in calls] == [s["response_id"] for s in report["steps"]]
    for call in calls:
        assert call["status"] == 200 and call["error"] is None and not call["stream"]
        assert call["path"] == "/v1/chat/completions" and call["model"] == server.served_model_name
        assert call["prompt_tokens"] > 1000 and 1 <= call["output_tokens"] <= 48
        assert call["ttft_s"] == call["total_s"] and call["decode_tps"] == call["output_tokens"] / call["total_s"]
    assert calls[1]["cached_tokens"] > 0  # the second prompt extends the first: served from the prefix cache
    if not any(s["commands"] for s in report["steps"]):
        assert agent["exit_status"] == "LimitsExceeded"
        assert report["patch"]["diff"] == "" and not report["tests"]["resolved"]
        assert report["tests"]["failing_tests"] == {FAILING: "FAILED"}
