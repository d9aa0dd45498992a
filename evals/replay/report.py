"""Run outputs: ``turns.jsonl``, ``summary.json`` and ``summary.md`` (the plots are in
:mod:`evals.replay.plots`).

Summary numbers are over the turns that succeeded (no error):

* ``ttft_mean_s`` / ``ttft_p50_s`` / ``ttft_max_s``: mean, median and maximum TTFT (s);
* ``decode_tps_mean``: mean of the per-request decode tok/s (the paper's "per-request mean");
* ``prompt_tokens`` / ``reused_tokens`` / ``output_tokens``: sums of the reported counts;
* ``reuse_ratio``: reused / prompt tokens over the turns that report both (None when none does).

``engine`` holds the FreeToken ``/metrics`` deltas over the run (:mod:`evals.replay.scrape`)
plus ``expert_hit_rate``, or None for other endpoints.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from evals.replay.scrape import hit_rate

SUMMARY_KEYS = ("workload", "endpoint", "label", "n_turns", "ttft_mean_s", "ttft_p50_s",
                "ttft_max_s", "decode_tps_mean", "reuse_ratio", "prompt_tokens", "reused_tokens",
                "output_tokens")


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def summarize(records: list[dict], *, workload: str, endpoint: str, label: str, protocol: str,
              model: str, traces: str, concurrency: int, wall_s: float,
              engine: dict | None) -> dict:
    """The ``summary.json`` object of a run (module docstring for the numbers)."""
    ok = [r for r in records if r["error"] is None]
    ttft = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
    tps = [r["decode_tps"] for r in ok if r["decode_tps"] is not None]
    both = [r for r in ok if r["prompt_tokens"] is not None and r["reused_tokens"] is not None]
    prompt_both = sum(r["prompt_tokens"] for r in both)
    engine_out = None
    if engine is not None:
        engine_out = {**engine, "expert_hit_rate": hit_rate(engine)}
    return {
        "workload": workload, "endpoint": endpoint, "label": label, "protocol": protocol,
        "model": model, "traces": traces, "concurrency": concurrency,
        "n_turns": len(records), "n_failed": len(records) - len(ok),
        "ttft_mean_s": _mean(ttft), "ttft_p50_s": statistics.median(ttft) if ttft else None,
        "ttft_max_s": max(ttft) if ttft else None, "decode_tps_mean": _mean(tps),
        "reuse_ratio": sum(r["reused_tokens"] for r in both) / prompt_both if prompt_both else None,
        "prompt_tokens": sum(r["prompt_tokens"] or 0 for r in ok),
        "reused_tokens": sum(r["reused_tokens"] or 0 for r in ok),
        "output_tokens": sum(r["output_tokens"] or 0 for r in ok),
        "wall_s": wall_s, "engine": engine_out,
    }


def fmt(value: object, digits: int = 3) -> str:
    """A table cell: ``-`` for None, floats with ``digits`` significant decimals."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _number(value: object) -> str:
    """Whole floats (counter values) as ints, other floats with 3 decimals."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return fmt(value)


def summary_markdown(summary: dict, records: list[dict]) -> str:
    """``summary.md``: the run's settings, the summary table, engine totals and every turn."""
    s = summary
    lines = [
        f"# {s['workload']} replay: {s['label']}", "",
        f"Endpoint `{s['endpoint']}` ({s['protocol']}), model `{s['model']}`, traces "
        f"`{s['traces']}`, concurrency {s['concurrency'] or 'as recorded'}, "
        f"{s['n_turns']} turns ({s['n_failed']} failed), {s['wall_s']:.1f} s wall.", "",
        "| turns | TTFT mean (s) | TTFT p50 (s) | TTFT max (s) | decode tok/s (mean) | "
        "reuse ratio | prompt tokens | reused tokens | output tokens |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {s['n_turns']} | {fmt(s['ttft_mean_s'])} | {fmt(s['ttft_p50_s'])} | "
        f"{fmt(s['ttft_max_s'])} | {fmt(s['decode_tps_mean'], 1)} | {fmt(s['reuse_ratio'])} | "
        f"{s['prompt_tokens']} | {s['reused_tokens']} | {s['output_tokens']} |",
    ]
    if s["engine"]:
        lines += ["", "Engine (FreeToken `/metrics`, deltas over the run): " + ", ".join(
            f"{k} {_number(v)}" for k, v in s["engine"].items())]
    lines += ["", "| # | call | prompt | reused | max_tokens | output | TTFT (s) | decode tok/s | "
              "edited | error |", "|---:|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in records:
        lines.append(
            f"| {r['index']} | {r['key']} | {fmt(r['prompt_tokens'])} | {fmt(r['reused_tokens'])} "
            f"| {r['max_tokens']} | {fmt(r['output_tokens'])} | {fmt(r['ttft_s'])} | "
            f"{fmt(r['decode_tps'], 1)} | {'yes' if r['edited'] else ''} | "
            f"{(r['error'] or '')[:80].replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def write_outputs(out: Path, records: list[dict], summary: dict) -> list[Path]:
    """Write turns.jsonl, summary.json and summary.md under ``out`` (created); returns them."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "turns.jsonl", out / "summary.json", out / "summary.md"]
    paths[0].write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
                        encoding="utf-8")
    paths[1].write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    paths[2].write_text(summary_markdown(summary, records), encoding="utf-8")
    return paths


def load_run(run_dir: Path) -> tuple[dict, list[dict]]:
    """``(summary, turn records)`` of a run folder.

    Raises:
        FileNotFoundError: no summary.json / turns.jsonl in ``run_dir``.
        ValueError: a summary without the keys of :data:`SUMMARY_KEYS`.
    """
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    missing = [k for k in SUMMARY_KEYS if k not in summary]
    if missing:
        raise ValueError(f"{run_dir}/summary.json lacks {', '.join(missing)}")
    records = [json.loads(line) for line in
               (run_dir / "turns.jsonl").read_text(encoding="utf-8").splitlines() if line]
    return summary, records
