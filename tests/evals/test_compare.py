"""``evals/compare.py`` and the peers report: which runs get ratios (request options, planned
turns, warm starts, older summaries), the traces source of every row, the warm start and MoE
settings table, unique labels (in the table and the plot), and clean errors for inputs that are
not run folders. Run folders are written
with the replay's own writer from hand-made summaries (exact ratios), no server needed."""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from evals.compare import main as compare_main
from evals.peers.report import build as build_peers_report
from evals.replay.comparison import compare_table, not_comparable, unique_labels
from evals.replay.plots import compare_figure
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


OPTIONS = {"select": [], "edits": True, "ignore_eos": True, "temperature": 1.0, "concurrency": 1,
           "w1_max_tokens": 512, "limit_turns": 4, "harness_header": False, "model": "m"}


def _new(label: str, ttft: float, tps: float, options: dict | None = None, **changes) -> dict:
    """A summary with the fields this round added (request options, digest, warm start)."""
    added = {"request_options": {**OPTIONS, **(options or {})}, "turn_keys_sha256": "d" * 64,
             "warm_start": False, "warm_start_rule": "metrics",
             "warm_start_evidence": "/metrics at the first scrape: "
                                    "freetoken_requests_added_total 0",
             "first_turn_warm": False, "server_moe": None}
    return _summary(label, ttft, tps, **{**added, **changes})


def test_runs_must_replay_the_same_requests() -> None:
    base = _new("ft", 2.0, 10.0)
    runs = [base, _new("same", 1.0, 25.0),
            _new("temp", 1.0, 25.0, {"temperature": 0.0}),
            _new("two", 1.0, 25.0, {"select": ["pydicom"], "model": "other"}),
            _new("eos", 1.0, 25.0, {"ignore_eos": False, "edits": False, "concurrency": 0,
                                    "w1_max_tokens": 64, "limit_turns": None,
                                    "harness_header": True}),
            _new("keys", 1.0, 25.0, turn_keys_sha256="e" * 64, n_planned=5),
            _new("warm", 1.0, 25.0, warm_start=True, first_turn_warm=True)]
    table = compare_table(runs)
    assert _row(table, "| same |").endswith("| 0.50 | 2.50 |")
    assert _row(table, "| temp (not comparable: temperature differs) |").endswith("|  |  |")
    assert _row(table, "| two (not comparable: select differs; model differs) |")
    assert _row(table, "| eos (not comparable: edits differs; ignore_eos differs; concurrency "
                       "differs; w1_max_tokens differs; limit_turns differs; harness_header "
                       "differs) |").endswith("|  |  |")
    assert _row(table, "| keys (not comparable: n_planned differs; planned turns differ "
                       "(turn_keys_sha256)) |").endswith("|  |  |")
    assert _row(table, "| warm (not comparable: warm start (run warm, baseline cold)) |"
                ).endswith("|  |  |")


def test_older_summaries_without_the_new_fields_stay_comparable() -> None:
    old, new = _summary("old", 2.0, 10.0), _new("new", 1.0, 20.0)
    del old["n_planned"]
    assert not_comparable(new, old) == [] and not_comparable(old, new) == []
    partial = _new("partial", 1.0, 20.0)
    del partial["request_options"]["temperature"]
    assert not_comparable(partial, _new("b", 1.0, 1.0, {"temperature": 0.5})) == []
    assert not_comparable(_new("x", 1, 1, warm_start=None, first_turn_warm=None),
                          _new("y", 1, 1, warm_start=True, first_turn_warm=True)) == []


def test_compare_md_shows_warm_starts_and_moe_settings(tmp_path: Path) -> None:
    memory = {"backend": "hybrid", "policy": "lru", "device": "cuda:0",
              "expert_cache": {"slots": 64, "expert_format": "mxfp4", "cpu_activations": "q8"}}
    newer = {"backend": "offload", "expert_format": "q4g", "cpu_activations": "bf16",
             "expert_cache": {"slots": 8}}  # fields at the top level win
    a = _write_run(tmp_path / "a", _new("A", 2.0, 10.0, server_moe=memory))
    b = _write_run(tmp_path / "b", _new("B", 1.0, 20.0, server_moe=newer))
    c = _write_run(tmp_path / "c", _new("C", 1.0, 20.0, warm_start=True, first_turn_warm=True,
                                        warm_start_evidence="first turn reused 9 of 10 prompt "
                                                            "tokens (>= 50%)"))
    d = _write_run(tmp_path / "d", _summary("D", 1.0, 20.0))  # an older run: nothing known
    assert compare_main([str(a), str(b), str(c), str(d), "--out", str(tmp_path / "cmp")]) == 0
    md = (tmp_path / "cmp/compare.md").read_text()
    assert ("\n**Warm start**: C had already served requests before the run; their TTFT/reuse "
            "are not cold-start measurements (no ratios between a warm and a cold run).\n") in md
    # a different backend / format / activations is what a user compares: ratios stay
    assert _row(md, "| B | W2 |").endswith("| 0.50 | 2.00 |")
    assert _row(md, "| D | W2 |").endswith("| 0.50 | 2.00 |")
    assert _row(md, "| C (not comparable: warm start (run warm, baseline cold)) |")
    assert ("| run | start | MoE backend | expert format | CPU activations |\n"
            "|---|---|---|---|---|\n"
            "| A | cold | hybrid | mxfp4 | q8 |\n"
            "| B | cold | offload | q4g | bf16 |\n"
            "| C | **WARM** | - | - | - |\n"
            "| D | unknown | - | - | - |\n") in md
    assert "; start: first turn reused 9 of 10 prompt tokens (>= 50%))\n" in md


def test_compare_png_uses_the_table_labels(tmp_path: Path) -> None:
    summaries = [_summary("127.0.0.1:8000", 1.0, 2.0), _summary("127.0.0.1:8000", 2.0, 1.0)]
    labels = unique_labels(summaries, [Path("/runs/W2"), Path("/runs/W2b")])
    assert labels == ["127.0.0.1:8000 (W2)", "127.0.0.1:8000 (W2b)"]
    fig = compare_figure(summaries, labels)
    try:
        for ax in fig.axes:
            assert [t.get_text() for t in ax.get_xticklabels()] == labels
    finally:
        plt.close(fig)
    with pytest.raises(ValueError, match="^1 labels for 2 runs$"):
        compare_figure(summaries, labels[:1])


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
