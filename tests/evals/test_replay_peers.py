"""``evals/replay_peers.py``: its options and the numbers it reads from a run folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evals.replay_peers import build_parser, summary


def test_workloads_option() -> None:
    assert build_parser().parse_args([]).workloads == ["W2", "W3", "W4"]
    assert build_parser().parse_args(["--workloads", "W4, W2"]).workloads == ["W4", "W2"]


@pytest.mark.parametrize("text", ["W5", "", "W2,,x"])
def test_bad_workloads_exit_2(text: str, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["--workloads", text])
    assert info.value.code == 2
    assert f"expected a comma list of W1, W2, W3, W4, got {text!r}" in capsys.readouterr().err


def test_summary_reads_the_run(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text(json.dumps({
        "n_turns": 8, "n_failed": 1, "ttft_mean_s": 1.5, "ttft_max_s": 3.25,
        "decode_tps_mean": 61.0, "prompt_tokens": 9000, "reused_tokens": 7250}))
    assert summary(tmp_path) == {"turns": 8, "failed": 1, "ttft_mean_s": 1.5, "ttft_max_s": 3.25,
                                 "decode_tok_s": 61.0, "recomputed_prompt_tokens": 1750}
