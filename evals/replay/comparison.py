"""Several replay runs side by side: one markdown table and one PNG (``evals/compare.py``).

Ratios are against the first run given (the baseline): ``TTFT x`` = this run's mean TTFT / the
baseline's (below 1: faster first token), ``decode x`` = this run's mean decode tok/s / the
baseline's (above 1: faster decode). Runs of different workloads can be listed together, but
the ratios only mean something between runs of the same workload and turn count, so the table
marks a run whose workload or number of turns differs from the baseline's.
"""

from __future__ import annotations

from pathlib import Path

from evals.replay.plots import plot_compare
from evals.replay.report import fmt, load_run


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def compare_table(summaries: list[dict]) -> str:
    """The markdown table (header, alignment row, one row per run).

    Raises:
        ValueError: no summaries.
    """
    if not summaries:
        raise ValueError("compare needs at least one run")
    base = summaries[0]
    rows = ["| run | workload | turns | TTFT mean (s) | TTFT p50 (s) | TTFT max (s) | "
            "decode tok/s | reuse ratio | TTFT x | decode x |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in summaries:
        same = s["workload"] == base["workload"] and s["n_turns"] == base["n_turns"]
        note = "" if same else " (not comparable)"
        rows.append(
            f"| {s['label']}{note} | {s['workload']} | {s['n_turns']} | {fmt(s['ttft_mean_s'])} | "
            f"{fmt(s['ttft_p50_s'])} | {fmt(s['ttft_max_s'])} | {fmt(s['decode_tps_mean'], 1)} | "
            f"{fmt(s['reuse_ratio'])} | {fmt(_ratio(s['ttft_mean_s'], base['ttft_mean_s']), 2)} | "
            f"{fmt(_ratio(s['decode_tps_mean'], base['decode_tps_mean']), 2)} |")
    return "\n".join(rows) + "\n"


def compare_runs(run_dirs: list[Path], out: Path) -> tuple[Path, Path, str]:
    """Read the runs, write ``out/compare.md`` and ``out/compare.png``; returns both paths and
    the table.

    Raises:
        FileNotFoundError / ValueError: a folder that is not a run (see ``load_run``), or none.
    """
    summaries = [load_run(d)[0] for d in run_dirs]
    table = compare_table(summaries)
    out.mkdir(parents=True, exist_ok=True)
    md = out / "compare.md"
    sources = "\n".join(f"- {s['label']}: `{d}` ({s['endpoint']}, {s['protocol']}, "
                        f"model `{s['model']}`)" for s, d in zip(summaries, run_dirs))
    md.write_text(f"# Replay comparison (baseline: {summaries[0]['label']})\n\n{table}\n"
                  f"{sources}\n", encoding="utf-8")
    png = plot_compare(out / "compare.png", summaries)
    return md, png, table
