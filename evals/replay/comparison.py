"""Several replay runs side by side: one markdown table and one PNG (``evals/compare.py``).

Ratios are against the first run given (the baseline): ``TTFT x`` = this run's mean TTFT / the
baseline's (below 1: faster first token), ``decode x`` = this run's mean decode tok/s / the
baseline's (above 1: faster decode). A ratio only means something between runs that replayed the
same requests to the end from the same starting point, so a run gets ratios only when, against
the baseline (:func:`not_comparable`):

* workload, traces (folder, or the synthetic set), protocol and number of turns are equal;
* the planned turns are the same (``n_planned`` and ``turn_keys_sha256``, the digest of their
  keys in plan order) and so is every request-shaping option in ``request_options`` (select,
  edits, ignore_eos, temperature, concurrency, w1_max_tokens, limit_turns, harness_header, the
  model name sent);
* both started cold or both warm (:func:`evals.replay.warm.warm_mismatch`; reason ``warm
  start``);
* neither had a failed turn or was interrupted.

Fields an older ``summary.json`` lacks count as unknown: they make runs not comparable only when
both summaries have them and they differ. Any other run is marked ``not comparable`` with the
reasons and its ratio cells are left blank. Every row names its traces source (``real`` /
``synthetic``). A second table lists each run's warm start and the FreeToken MoE settings
(backend, expert format, CPU activations): they differ between runs on purpose (that is what a
user compares), so they never withhold ratios. Repeated labels are made unique by appending the
run folder's name; ``compare.png`` uses exactly those labels.
"""

from __future__ import annotations

from pathlib import Path

from evals.replay.plots import plot_compare
from evals.replay.report import fmt, load_run, moe_settings
from evals.replay.warm import warm_mismatch

MATCH_KEYS = ("workload", "traces", "protocol", "n_turns")
REQUEST_OPTIONS = ("select", "edits", "ignore_eos", "temperature", "concurrency",
                   "w1_max_tokens", "limit_turns", "harness_header", "model")


def traces_source(summary: dict) -> str:
    """``"real"`` or ``"synthetic"`` (older summaries without ``traces_source``: from
    ``traces``)."""
    return summary.get("traces_source") or (
        "synthetic" if summary.get("traces") == "synthetic" else "real")


def _both_differ(a: dict, b: dict, key: str) -> bool:
    """Both dicts have ``key`` (not None) and the values differ."""
    return a.get(key) is not None and b.get(key) is not None and a[key] != b[key]


def request_differences(run: dict, base: dict) -> list[str]:
    """``<option> differs`` for every request-shaping difference: ``n_planned``,
    ``turn_keys_sha256`` (``planned turns differ``) and each :data:`REQUEST_OPTIONS` entry of
    ``request_options`` that both summaries record."""
    reasons = []
    if _both_differ(run, base, "n_planned"):
        reasons.append("n_planned differs")
    if _both_differ(run, base, "turn_keys_sha256"):
        reasons.append("planned turns differ (turn_keys_sha256)")
    opts_run, opts_base = run.get("request_options"), base.get("request_options")
    if isinstance(opts_run, dict) and isinstance(opts_base, dict):
        reasons += [f"{key} differs" for key in REQUEST_OPTIONS
                    if key in opts_run and key in opts_base and opts_run[key] != opts_base[key]]
    return reasons


def not_comparable(run: dict, base: dict) -> list[str]:
    """Why ratios of ``run`` against ``base`` would mislead (empty: comparable; module
    docstring): a differing workload, traces, protocol or turn count, other planned turns or
    request options, one warm and one cold start, a failed turn or an interruption in either
    run."""
    reasons = [f"{key} differs" for key in MATCH_KEYS if run.get(key) != base.get(key)]
    reasons += request_differences(run, base)
    warm = warm_mismatch(run, base)
    if warm:
        reasons.append(warm)
    checks = [("run", run)] if run is base else [("run", run), ("baseline", base)]
    for who, s in checks:
        if s.get("n_failed"):
            reasons.append(f"{who} has {s['n_failed']} failed turn(s)")
        if s.get("interrupted"):
            reasons.append(f"{who} was interrupted")
    return reasons


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def ratios(run: dict, base: dict) -> tuple[float | None, float | None]:
    """``(TTFT x, decode x)`` of ``run`` against ``base``; both None when not comparable."""
    if not_comparable(run, base):
        return None, None
    return (_ratio(run["ttft_mean_s"], base["ttft_mean_s"]),
            _ratio(run["decode_tps_mean"], base["decode_tps_mean"]))


def unique_labels(summaries: list[dict], run_dirs: list[Path]) -> list[str]:
    """Each run's label; a label used by several runs gets `` (<run folder name>)`` appended
    (and, were that still ambiguous, the run's position)."""
    labels = [str(s["label"]) for s in summaries]
    out = [f"{lab} ({d.name})" if labels.count(lab) > 1 else lab
           for lab, d in zip(labels, run_dirs)]
    return [f"{lab} #{i + 1}" if out.count(lab) > 1 else lab for i, lab in enumerate(out)]


def _cell(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def compare_table(summaries: list[dict], labels: list[str] | None = None) -> str:
    """The markdown table (header, alignment row, one row per run); ``labels`` default to the
    summaries' labels.

    Raises:
        ValueError: no summaries.
    """
    if not summaries:
        raise ValueError("compare needs at least one run")
    labels = labels or [str(s["label"]) for s in summaries]
    base = summaries[0]
    rows = ["| run | workload | traces | protocol | turns | failed | TTFT mean (s) | "
            "TTFT p50 (s) | TTFT max (s) | decode tok/s | reuse ratio | TTFT x | decode x |",
            "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s, label in zip(summaries, labels):
        why = not_comparable(s, base)
        note = f" (not comparable: {'; '.join(why)})" if why else ""
        ttft_x, decode_x = ratios(s, base)
        rows.append(
            f"| {label}{note} | {s['workload']} | {traces_source(s)} | {s.get('protocol', '-')} "
            f"| {s['n_turns']} | {s.get('n_failed', 0)} | {fmt(s['ttft_mean_s'])} | "
            f"{fmt(s['ttft_p50_s'])} | {fmt(s['ttft_max_s'])} | {fmt(s['decode_tps_mean'], 1)} "
            f"| {fmt(s['reuse_ratio'])} | {_cell(ttft_x)} | {_cell(decode_x)} |")
    return "\n".join(rows) + "\n"


def _warm_cell(summary: dict) -> str:
    warm = summary.get("warm_start")
    return "unknown" if warm is None else "**WARM**" if warm else "cold"


def settings_table(summaries: list[dict], labels: list[str]) -> str:
    """The second markdown table: per run its warm start (``**WARM**`` / ``cold`` /
    ``unknown``) and FreeToken's MoE backend, expert format and CPU activations (from
    ``server_moe``; ``-`` for other servers and older summaries)."""
    rows = ["| run | start | MoE backend | expert format | CPU activations |",
            "|---|---|---|---|---|"]
    for s, label in zip(summaries, labels):
        moe = moe_settings(s.get("server_moe"))
        rows.append(f"| {label} | {_warm_cell(s)} | {fmt(moe.get('backend'))} | "
                    f"{fmt(moe.get('expert_format'))} | {fmt(moe.get('cpu_activations'))} |")
    return "\n".join(rows) + "\n"


def compare_runs(run_dirs: list[Path], out: Path) -> tuple[Path, Path, str]:
    """Read the runs, write ``out/compare.md`` and ``out/compare.png``; returns both paths and
    the table.

    Raises:
        FileNotFoundError / ValueError: a folder that is not a run (see ``load_run``), or none.
    """
    summaries = [load_run(d)[0] for d in run_dirs]
    labels = unique_labels(summaries, run_dirs)
    table = compare_table(summaries, labels) + "\n" + settings_table(summaries, labels)
    out.mkdir(parents=True, exist_ok=True)
    md = out / "compare.md"
    sources = "\n".join(f"- {label}: `{d}` ({s['endpoint']}, {s.get('protocol', '-')}, model "
                        f"`{s.get('model', '-')}`, traces `{s.get('traces', '-')}`"
                        + (f"; start: {s['warm_start_evidence']}"
                           if s.get("warm_start_evidence") else "") + ")"
                        for s, label, d in zip(summaries, labels, run_dirs))
    synthetic = [label for s, label in zip(summaries, labels) if traces_source(s) == "synthetic"]
    warn = (f"**Synthetic traces** (not real agent traffic): {', '.join(synthetic)}.\n\n"
            if synthetic else "")
    warm = [label for s, label in zip(summaries, labels) if s.get("warm_start")]
    if warm:
        warn += (f"**Warm start**: {', '.join(warm)} had already served requests before the run; "
                 "their TTFT/reuse are not cold-start measurements (no ratios between a warm and "
                 "a cold run).\n\n")
    md.write_text(f"# Replay comparison (baseline: {labels[0]})\n\n{warn}{table}\n"
                  f"{sources}\n", encoding="utf-8")
    png = plot_compare(out / "compare.png", summaries, labels)
    return md, png, table
