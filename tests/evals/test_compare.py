"""``evals/compare.py`` and the peers report: which runs get ratios, the traces source of every
row, unique labels, and clean errors for inputs that are not run folders. Run folders are written
with the replay's own writer from hand-made summaries (exact ratios), no server needed."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from evals.compare import main as compare_main
from evals.peers.report import build as build_peers_report
from evals.replay.comparison import compare_table, not_comparable, unique_labels
from evals.replay.report import write_outputs


def _summary(label: str, ttft: float, tps: float, **changes) -> dict:
    base = {"workload": "W2", "endpoint": "http://h:1", "label": label, "protocol": "openai",
            "model": "m", "traces": "/data/traces", "traces_source": "real", "concurrency": 1,
            "n_turns": 4, "n_failed": 0, "n_planned": 4, "interrupted": False,
            "ttft_mean_s": ttft, "ttft_p50_s": ttft, "ttft_max_s": ttft, "decode_tps_mean": tps,
            "reuse_ratio": 0.5, "prompt_tokens": 100, "reused_tokens": 50, "output_tokens": 40,
            "wall_s": 1.0, "engine": None}
    return {**base, **changes}


def _write_run(folder: Path, summary: dict) -> Path:
    write_outputs(folder, [], summary)
    return folder


def _row(table: str, start: str) -> str:
    return next(line for line in table.splitlines() if line.startswith(start))


def test_only_comparable_runs_get_ratios() -> None:
    base = _summary("ft", 2.0, 10.0)
    runs = [base, _summary("same", 1.0, 25.0),
            _summary("failed", 1.0, 25.0, n_failed=1),
            _summary("proto", 1.0, 25.0, protocol="anthropic"),
            _summary("synth", 1.0, 25.0, traces="synthetic", traces_source="synthetic"),
            _summary("short", 1.0, 25.0, n_turns=3, interrupted=True)]
    table = compare_table(runs)
    assert _row(table, "| ft |") == ("| ft | W2 | real | openai | 4 | 0 | 2.000 | 2.000 | 2.000 | "
                                     "10.0 | 0.500 | 1.00 | 1.00 |")
    assert _row(table, "| same |").endswith("| 25.0 | 0.500 | 0.50 | 2.50 |")
    assert _row(table, "| failed (not comparable: run has 1 failed turn(s)) | W2 | real | openai "
                       "| 4 | 1 |").endswith("| 25.0 | 0.500 |  |  |")
    assert _row(table, "| proto (not comparable: protocol differs) | W2 | real | anthropic |"
                ).endswith("|  |  |")
    assert _row(table, "| synth (not comparable: traces differs) | W2 | synthetic | openai |"
                ).endswith("|  |  |")
    assert _row(table, "| short (not comparable: n_turns differs; run was interrupted) |"
                ).endswith("|  |  |")
    assert not_comparable(base, _summary("x", 1, 1, n_failed=2)) == ["baseline has 2 failed turn(s)"]


def test_a_failed_baseline_gives_nobody_ratios() -> None:
    table = compare_table([_summary("ft", 2.0, 10.0, n_failed=1), _summary("ok", 1.0, 5.0)])
    assert _row(table, "| ft (not comparable: run has 1 failed turn(s)) |").endswith("|  |  |")
    assert _row(table, "| ok (not comparable: baseline has 1 failed turn(s)) |").endswith("|  |  |")


def test_duplicate_labels_get_the_run_folder() -> None:
    summaries = [_summary("A", 1, 1), _summary("A", 1, 1), _summary("B", 1, 1)]
    dirs = [Path("/r/one"), Path("/r/two"), Path("/r/three")]
    assert unique_labels(summaries, dirs) == ["A (one)", "A (two)", "B"]
    assert unique_labels(summaries[:2], [Path("/x/run"), Path("/y/run")]) == ["A (run) #1",
                                                                              "A (run) #2"]


def test_compare_cli_rejects_what_is_not_a_run(tmp_path: Path,
                                               capsys: pytest.CaptureFixture) -> None:
    run = _write_run(tmp_path / "run", _summary("A", 1.0, 2.0))
    afile = tmp_path / "afile"
    afile.write_text("x")
    (tmp_path / "empty").mkdir()
    assert compare_main([str(afile)]) == 2
    assert compare_main([str(tmp_path / "empty")]) == 2
    assert compare_main([str(run), "--out", str(afile)]) == 2
    assert compare_main([str(run), "--out", str(afile / "sub")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"compare: {afile} is a file, not a run folder (pass the --out folder of evals/run.py)",
        f"compare: {tmp_path}/empty: no summary.json (not an evals/run.py output folder)",
        f"compare: --out {afile}: exists and is not a folder",
        f"compare: --out {afile}/sub: {afile} is not a folder",
    ]
    assert compare_main([str(run), str(run), "--out", str(tmp_path / "cmp")]) == 0
    md = (tmp_path / "cmp/compare.md").read_text()
    assert md.startswith("# Replay comparison (baseline: A (run) #1)\n\n| run |")


def test_compare_md_warns_about_synthetic_runs(tmp_path: Path) -> None:
    a = _write_run(tmp_path / "a", _summary("A", 1.0, 2.0, traces="synthetic",
                                            traces_source="synthetic"))
    b = _write_run(tmp_path / "b", _summary("B", 2.0, 1.0, traces="synthetic",
                                            traces_source="synthetic"))
    assert compare_main([str(a), str(b), "--out", str(tmp_path / "c")]) == 0
    md = (tmp_path / "c/compare.md").read_text()
    assert "**Synthetic traces** (not real agent traffic): A, B.\n" in md
    assert _row(md, "| B | W2 | synthetic |").endswith("| 2.00 | 0.50 |")


def _peers_args(out: Path, traces: str) -> argparse.Namespace:
    return argparse.Namespace(out=str(out), workloads="W1 W2", gguf="g.gguf", model_dir="m",
                              outtype="f32", n_ctx="32768", threads="2", limit_turns="4",
                              w1_max_tokens="256", build_stamp="", peer_python="p",
                              llama_kv="f32", traces=traces)


def test_peers_report_names_traces_and_withholds_ratios(tmp_path: Path) -> None:
    _write_run(tmp_path / "W1-freetoken", _summary("freetoken", 2.0, 10.0, workload="W1"))
    _write_run(tmp_path / "W1-llamacpp", _summary("llamacpp", 1.0, 20.0, workload="W1"))
    _write_run(tmp_path / "W2-freetoken", _summary("freetoken", 2.0, 10.0))
    _write_run(tmp_path / "W2-llamacpp", _summary("llamacpp", 1.0, 20.0, n_failed=1))
    md, data = build_peers_report(_peers_args(tmp_path, "/data/traces"))
    assert "- traces: real (`/data/traces`)\n" in md
    assert "| W1 | real | 4 | 10.0 | 20.0 | 2.00 | 2.000 | 1.000 | 0.50 |" in md
    assert ("| W2 (not comparable: run has 1 failed turn(s)) | real | 4 | 10.0 | 20.0 |  | 2.000 "
            "| 1.000 |  |") in md
    w2 = data["rows"][1]
    assert w2["decode_ratio_llamacpp_over_freetoken"] is None and w2["ttft_ratio_llamacpp_over_freetoken"] is None


def test_peers_report_is_loud_about_synthetic_traces(tmp_path: Path) -> None:
    for side in ("freetoken", "llamacpp"):
        _write_run(tmp_path / f"W1-{side}", _summary(side, 1.0, 1.0, workload="W1",
                                                     traces="synthetic", traces_source="synthetic"))
    md, _ = build_peers_report(_peers_args(tmp_path, "synthetic"))
    assert "- traces: **SYNTHETIC** (the built-in generated set, not real agent traffic" in md
    assert "| W1 | synthetic | 4 |" in md
