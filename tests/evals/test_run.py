"""The replay end to end against the recording stub server (tests/evals/stub_server.py): what
reaches the endpoint, how it is measured, concurrency, metrics scraping and the output files."""

from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path

import pytest

from evals.compare import main as compare_main
from evals.replay.app import RunOptions, run_workload
from evals.replay.synthetic import write_synthetic_traces
from evals.replay.turns import RequestOptions, build_request
from evals.replay.workloads import build_plan
from evals.run import main as run_main
from tests.evals.stub_server import (
    GENERATED, StubServer, scripted_prompt_tokens, scripted_reused_tokens,
)

PNG = b"\x89PNG\r\n\x1a\n"
TURN_FIELDS = {
    "index", "key", "session", "thread", "turn", "harness", "recorded_protocol", "messages",
    "edited", "verbatim", "max_tokens", "max_tokens_source", "status", "error", "prompt_tokens",
    "reused_tokens", "output_tokens", "output_tokens_source", "ttft_s", "decode_s", "decode_tps",
    "total_s", "start_s", "end_s", "finish_reason", "engine",
}


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_traces(tmp_path_factory.mktemp("synthetic"))


def _run(stub: StubServer, traces: Path, out: Path, workload: str, **kw) -> dict:
    return run_workload(RunOptions(workload=workload, endpoint=stub.url, out=out,
                                   traces=str(traces), progress=False, **kw))


def _records(out: Path) -> list[dict]:
    return [json.loads(t) for t in (out / "turns.jsonl").read_text().splitlines()]


def test_w2_run_requests_and_outputs(tmp_path: Path, traces: Path) -> None:
    with StubServer() as stub:
        summary = _run(stub, traces, tmp_path, "W2", limit_turns=6)
    plan = build_plan("W2", traces, limit=6)
    bodies = stub.bodies
    assert [e["path"] for e in stub.state.log] == ["/v1/chat/completions"] * 6
    for call, body in zip(plan, bodies):
        assert body["model"] == "stub-model" and body["stream"] is True
        assert body["ignore_eos"] is True
        assert body == build_request(call, RequestOptions("openai", "stub-model")).body
    # the next turn carries the recorded reply, never the generated text
    for call, nxt in zip(plan[:2], bodies[1:3]):
        assert nxt["messages"][len(call.messages)]["content"] == call.response["content"]
    assert not any(GENERATED in json.dumps(b) for b in bodies)

    records = _records(tmp_path)
    assert [set(r) for r in records] == [TURN_FIELDS] * 6
    assert [r["prompt_tokens"] for r in records] == [scripted_prompt_tokens(b) for b in bodies]
    assert [r["reused_tokens"] for r in records] == [scripted_reused_tokens(b) for b in bodies]
    assert [r["output_tokens"] for r in records] == [b["max_tokens"] for b in bodies]
    assert all(r["output_tokens_source"] == "usage" and r["finish_reason"] == "length"
               for r in records)
    assert all(0 < r["ttft_s"] < r["total_s"] and r["decode_tps"] > 0 for r in records)
    assert records[0]["engine"] == {"expert_hits": 3.0, "expert_misses": 1.0,
                                    "checkpoint_saves": 2.0, "checkpoint_loads": 1.0,
                                    "requests_added": 1, "checkpoints_device": 4.0}

    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved == json.loads(json.dumps(summary))
    ttft = [r["ttft_s"] for r in records]
    prompt = sum(scripted_prompt_tokens(b) for b in bodies)
    reused = sum(scripted_reused_tokens(b) for b in bodies)
    assert summary["n_turns"] == 6 and summary["n_failed"] == 0
    assert summary["prompt_tokens"] == prompt and summary["reused_tokens"] == reused
    assert summary["reuse_ratio"] == pytest.approx(reused / prompt)
    assert summary["output_tokens"] == sum(b["max_tokens"] for b in bodies)
    assert summary["ttft_mean_s"] == pytest.approx(statistics.fmean(ttft))
    assert summary["ttft_p50_s"] == pytest.approx(statistics.median(ttft))
    assert summary["ttft_max_s"] == max(ttft)
    assert summary["decode_tps_mean"] == pytest.approx(
        statistics.fmean(r["decode_tps"] for r in records))
    assert summary["engine"]["expert_hits"] == 18 and summary["engine"]["expert_misses"] == 6
    assert summary["engine"]["expert_hit_rate"] == pytest.approx(0.75)
    assert summary["engine"]["requests_added"] == 6
    # a fresh server: cold by its /metrics, and by the first turn's reuse (a quarter < half)
    first = records[0]
    assert {k: summary[k] for k in ("warm_start", "warm_start_rule", "warm_start_evidence",
                                    "first_turn_warm")} == {
        "warm_start": False, "warm_start_rule": "metrics",
        "warm_start_evidence": "/metrics at the first scrape: freetoken_requests_added_total 0",
        "first_turn_warm": False}
    assert first["reused_tokens"] < first["prompt_tokens"] / 2
    assert summary["request_options"] == {
        "select": [], "edits": True, "ignore_eos": True, "temperature": 1.0, "concurrency": 1,
        "w1_max_tokens": 512, "limit_turns": 6, "harness_header": False, "model": "stub-model"}
    assert summary["turn_keys_sha256"] == hashlib.sha256(
        "\n".join(c.key for c in plan).encode()).hexdigest()
    assert summary["server_moe"] is None and summary["interrupted_by"] is None
    md = (tmp_path / "summary.md").read_text()
    assert f"| 6 | {summary['ttft_mean_s']:.3f} |" in md and "expert_hit_rate 0.750" in md
    assert ("\nCold start (evidence: /metrics at the first scrape: "
            "freetoken_requests_added_total 0).\n") in md and "WARM" not in md
    for name in ("ttft.png", "decode_tps.png", "reuse.png"):
        data = (tmp_path / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 2000


def test_w3_subagents_run_concurrently_in_thread_order(tmp_path: Path, traces: Path) -> None:
    with StubServer(first_delay_s=0.15, freetoken=False) as stub:
        summary = _run(stub, traces, tmp_path, "W3")
    log = stub.state.log
    assert summary["protocol"] == "anthropic" and summary["concurrency"] == 0
    assert summary["engine"] is None and all(e["path"] == "/v1/messages" for e in log)
    plan = {c.key: c for c in build_plan("W3", traces)}
    by_key = {}
    for entry in log:
        body = entry["body"]
        key = next(k for k, c in plan.items() if c.messages == body["messages"])
        by_key[key] = entry
    assert len(by_key) == 9
    for key, call in plan.items():  # every dependency finished before the call was sent
        for dep in call.deps:
            assert by_key[dep]["t_end"] <= by_key[key]["t_start"]
    in_flight = max(sum(1 for e in log if e["t_start"] <= x["t_start"] < e["t_end"])
                    for x in log)
    assert in_flight == 2  # the two sub-agent threads side by side
    assert [r["key"] for r in _records(tmp_path)] == list(plan)
    records = _records(tmp_path)
    assert [r["max_tokens"] for r in records] == [40, 90, 30, 30, 40, 40, 50, 50, 25]
    assert [r["reused_tokens"] for r in records] == \
        [scripted_reused_tokens(by_key[k]["body"]) for k in plan]
    assert [r["prompt_tokens"] for r in records] == \
        [scripted_prompt_tokens(by_key[k]["body"]) for k in plan]


def test_w3_with_concurrency_one_is_sequential(tmp_path: Path, traces: Path) -> None:
    with StubServer(freetoken=False) as stub:
        _run(stub, traces, tmp_path, "W3", concurrency=1)
    log = stub.state.log
    assert all(a["t_end"] <= b["t_start"] for a, b in zip(log, log[1:]))
    assert [e["body"]["messages"] for e in log] == \
        [c.messages for c in build_plan("W3", traces)]


def test_protocol_override_and_no_ignore_eos(tmp_path: Path, traces: Path) -> None:
    with StubServer(freetoken=False) as stub:
        summary = _run(stub, traces, tmp_path, "W3", protocol="openai", ignore_eos=False,
                       limit_turns=2, harness_header=True, api_key="k1")
    assert [e["path"] for e in stub.state.log] == ["/v1/chat/completions"] * 2
    sent = {k.lower(): v for k, v in stub.state.log[0]["headers"].items()}
    assert sent["x-freetoken-harness"] == "claude_code"
    assert sent["authorization"] == "Bearer k1" and sent["x-api-key"] == "k1"
    assert all("ignore_eos" not in b for b in stub.bodies)
    assert stub.bodies[1]["messages"][1]["tool_calls"][0]["function"]["name"] == "Glob"
    assert summary["output_tokens"] == 4  # 2 tokens each without ignore_eos


def test_missing_default_traces_fall_back_to_synthetic_loudly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("FREETOKEN_SHARED", str(tmp_path / "nowhere"))
    with StubServer(freetoken=False) as stub:
        summary = run_workload(RunOptions(workload="W1", endpoint=stub.url, out=tmp_path / "out",
                                          limit_turns=3, w1_max_tokens=5, progress=False))
    assert capsys.readouterr().err == (
        f"run: no traces folder at {tmp_path}/nowhere/traces; replaying the built-in SYNTHETIC "
        "set (not real agent traffic); pass --traces DIR or set FREETOKEN_SHARED\n")
    assert summary["traces"] == "synthetic" and summary["traces_source"] == "synthetic"
    assert summary["n_turns"] == 3
    assert (tmp_path / "out/synthetic-traces/W1_math_aime/synthetic_math.jsonl").is_file()
    assert [b["max_tokens"] for b in stub.bodies] == [5, 5, 5]
    assert stub.bodies[0]["messages"][0]["content"].startswith("Problem 1. Compute")
    md = (tmp_path / "out/summary.md").read_text()
    assert md.startswith(f"# W1 replay: {stub.url.split('://')[1]} (traces: SYNTHETIC (not real "
                         "agent traffic))\n")


def test_w4_session_replay(tmp_path: Path, traces: Path) -> None:
    with StubServer(freetoken=False) as stub:
        summary = _run(stub, traces, tmp_path, "W4")
    assert summary["n_turns"] == 15
    plan = build_plan("W4", traces)
    assert stub.bodies == [build_request(c, RequestOptions("openai", "stub-model")).body
                           for c in plan]
    # read calendar (+tool result), answer, next prompt, read inbox (+result), ...: +2 each call
    assert [len(b["messages"]) for b in stub.bodies] == list(range(2, 31, 2))
    assert sum(m["role"] == "user" for m in stub.bodies[-1]["messages"]) == 13
    assert all(r["max_tokens_source"] == "estimate" for r in _records(tmp_path))


def test_cli_exit_codes_and_compare(tmp_path: Path, traces: Path,
                                    capsys: pytest.CaptureFixture) -> None:
    argv = ["--workload", "W2", "--traces", str(traces), "--limit-turns", "3", "--no-progress"]
    with StubServer() as stub:
        assert run_main(argv + ["--endpoint", stub.url, "--out", str(tmp_path / "a"),
                                "--label", "A"]) == 0
    with StubServer(first_delay_s=0.05) as stub:  # a fresh (cold) server
        url = ["--endpoint", stub.url]
        assert run_main(argv + url + ["--out", str(tmp_path / "a2"), "--label", "A"]) == 0
        stub.state.fail_on = len(stub.state.log) + 1
        assert run_main(argv + url + ["--out", str(tmp_path / "b"), "--label", "B"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("W2 A: 3 turns (0 failed), TTFT mean ")
    assert out[0].endswith(f"; traces: real; wrote {tmp_path / 'a'}")
    assert out[2].endswith(f"; traces: real; WARM start; wrote {tmp_path / 'b'}")
    failed = _records(tmp_path / "b")[1]
    assert failed["status"] == 500 and failed["error"].startswith("HTTP 500: ")
    assert json.loads((tmp_path / "b/summary.json").read_text())["n_failed"] == 1
    assert run_main(["--workload", "W2", "--endpoint", "http://x", "--traces", str(traces),
                     "--select", "nothing-matches", "--out", str(tmp_path / "c")]) == 2

    assert compare_main([str(tmp_path / "a"), str(tmp_path / "a2"), str(tmp_path / "b"),
                         "--out", str(tmp_path / "cmp")]) == 0
    a = json.loads((tmp_path / "a/summary.json").read_text())
    a2 = json.loads((tmp_path / "a2/summary.json").read_text())
    assert a2["traces"] == a["traces"] == str(traces.resolve())
    rows = (tmp_path / "cmp/compare.md").read_text().splitlines()
    row_a = next(line for line in rows if line.startswith("| A (a) | W2 | real | openai | 3 | 0 |"))
    assert row_a.endswith("| 1.00 | 1.00 |")
    row_a2 = next(line for line in rows if line.startswith("| A (a2) | W2 | real | openai | 3 | 0 |"))
    assert f"| {a2['ttft_mean_s'] / a['ttft_mean_s']:.2f} |" in row_a2
    assert row_a2.endswith(f"| {a2['decode_tps_mean'] / a['decode_tps_mean']:.2f} |")
    row_b = next(line for line in rows if line.startswith(
        "| B (not comparable: warm start (run warm, baseline cold); run has 1 failed turn(s)) | "
        "W2 | real | openai | 3 | 1 |"))
    assert row_b.endswith(" |  |  |")  # no ratios
    assert "| B | **WARM** | - | - | - |" in rows and "| A (a2) | cold | - | - | - |" in rows
    assert (tmp_path / "cmp/compare.png").read_bytes().startswith(PNG)
    assert compare_main([str(tmp_path / "nothing")]) == 2


def test_a_second_run_against_the_same_server_is_warm(tmp_path: Path, traces: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    argv = ["--workload", "W2", "--traces", str(traces), "--limit-turns", "2", "--no-progress"]
    with StubServer() as stub:
        url = ["--endpoint", stub.url]
        assert run_main(argv + url + ["--out", str(tmp_path / "cold"), "--label", "ft"]) == 0
        stub.state.reuse_fraction = 1.0  # the prompts are in the prefix cache now
        assert run_main(argv + url + ["--out", str(tmp_path / "warm"), "--label", "ft"]) == 0
    err = capsys.readouterr().err
    assert err == ("run: WARM: the server had already served requests before this run; its "
                   "TTFT/reuse are not a cold-start measurement (/metrics at the first scrape: "
                   "freetoken_requests_added_total 2)\n")
    warm = json.loads((tmp_path / "warm/summary.json").read_text())
    first = _records(tmp_path / "warm")[0]
    assert first["reused_tokens"] == first["prompt_tokens"]
    assert (warm["warm_start"], warm["warm_start_rule"], warm["first_turn_warm"]) == (
        True, "metrics", True)
    md = (tmp_path / "warm/summary.md").read_text()
    assert ("\n**WARM: the server had already served requests before this run; its TTFT/reuse "
            "are not a cold-start measurement** (evidence: /metrics at the first scrape: "
            "freetoken_requests_added_total 2).\n") in md
    assert compare_main([str(tmp_path / "cold"), str(tmp_path / "warm"),
                         "--out", str(tmp_path / "cmp")]) == 0
    md = (tmp_path / "cmp/compare.md").read_text()
    assert ("**Warm start**: ft (warm) had already served requests before the run; their "
            "TTFT/reuse are not cold-start measurements (no ratios between a warm and a cold "
            "run).\n") in md
    assert next(line for line in md.splitlines() if line.startswith("| ft (warm) ")).startswith(
        "| ft (warm) (not comparable: warm start (run warm, baseline cold)) | W2 |")
    assert md.splitlines()[-1] == (
        f"- ft (warm): `{tmp_path / 'warm'}` ({warm['endpoint']}, openai, model `stub-model`, "
        f"traces `{warm['traces']}`; start: /metrics at the first scrape: "
        "freetoken_requests_added_total 2)")
