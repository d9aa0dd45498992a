"""Run outputs: ``turns.jsonl``, ``summary.json`` and ``summary.md`` (the plots are in
:mod:`evals.replay.plots`).

Summary numbers are over the turns that succeeded (no error):

* ``ttft_mean_s`` / ``ttft_p50_s`` / ``ttft_max_s``: mean, median and maximum TTFT (s);
* ``decode_tps_mean``: mean of the per-request decode tok/s (the paper's "per-request mean");
* ``prompt_tokens`` / ``reused_tokens`` / ``output_tokens``: sums of the reported counts;
* ``reuse_ratio``: reused / prompt tokens over the turns that report both (None when none does).

``engine`` holds the FreeToken ``/metrics`` counter deltas over the run and the checkpoint
gauges at its end (:mod:`evals.replay.scrape`) plus ``expert_hit_rate``, or None for other
endpoints (and for an interrupted run, which has no final scrape).

``traces_source`` is ``"real"`` (a recorded traces folder) or ``"synthetic"`` (the built-in set);
``interrupted`` is true when the run was stopped (Ctrl-C or SIGTERM, named by ``interrupted_by``)
before every planned turn finished, and then the numbers cover the ``n_turns`` finished turns of
``n_planned``.

What makes runs comparable (:mod:`evals.replay.comparison`): ``request_options`` (the options that
shape the requests: ``select``, ``edits``, ``ignore_eos``, ``temperature``, ``concurrency``,
``w1_max_tokens``, ``limit_turns``, ``harness_header`` and the ``model`` name sent),
``turn_keys_sha256`` (:func:`turn_keys_digest` of the planned turns' keys, in plan order) and the
warm-start fields of :func:`evals.replay.warm.warm_start`. ``server_moe`` is FreeToken's
``GET /v1/freetoken/memory`` answer at the start of the run (None for other servers).
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
from pathlib import Path

from evals.replay.scrape import COUNTERS, GAUGES, hit_rate
from evals.replay.warm import WARM_LINE

SUMMARY_KEYS = ("workload", "endpoint", "label", "n_turns", "ttft_mean_s", "ttft_p50_s",
                "ttft_max_s", "decode_tps_mean", "reuse_ratio", "prompt_tokens", "reused_tokens",
                "output_tokens")


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def turn_keys_digest(keys: list[str]) -> str:
    """sha256 (hex) of the turn keys (``<trace file>#<line>``) joined by newlines, in plan order:
    two runs with the same digest replayed the same calls in the same order."""
    return hashlib.sha256("\n".join(keys).encode("utf-8")).hexdigest()


def moe_settings(server_moe: dict | None) -> dict[str, object]:
    """``backend``, ``expert_format`` and ``cpu_activations`` of a ``/v1/freetoken/memory``
    answer, read at its top level or else in its ``expert_cache`` object; the keys it lacks are
    left out (empty for None)."""
    if not isinstance(server_moe, dict):
        return {}
    cache = server_moe.get("expert_cache")
    cache = cache if isinstance(cache, dict) else {}
    out = {}
    for key in ("backend", "expert_format", "cpu_activations"):
        value = server_moe.get(key, cache.get(key))
        if value is not None:
            out[key] = value
    return out


def summarize(records: list[dict], *, workload: str, endpoint: str, label: str, protocol: str,
              model: str, traces: str, concurrency: int, wall_s: float,
              engine: dict | None, traces_source: str | None = None,
              n_planned: int | None = None, interrupted: bool = False,
              interrupted_by: str | None = None, warm: dict | None = None,
              request_options: dict | None = None, turn_keys_sha256: str | None = None,
              server_moe: dict | None = None) -> dict:
    """The ``summary.json`` object of a run (module docstring for the numbers).

    ``traces`` is the folder replayed (or ``"synthetic"``); ``traces_source`` defaults to
    ``"synthetic"`` when ``traces`` is, else ``"real"``; ``n_planned`` defaults to the number of
    records. ``warm`` holds the fields of :func:`evals.replay.warm.warm_start` (None: all
    unknown); ``request_options``, ``turn_keys_sha256`` and ``server_moe`` are stored as given
    (module docstring)."""
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
        "model": model, "traces": traces,
        "traces_source": traces_source or ("synthetic" if traces == "synthetic" else "real"),
        "concurrency": concurrency, "n_turns": len(records), "n_failed": len(records) - len(ok),
        "n_planned": len(records) if n_planned is None else n_planned,
        "interrupted": interrupted,
        "ttft_mean_s": _mean(ttft), "ttft_p50_s": statistics.median(ttft) if ttft else None,
        "ttft_max_s": max(ttft) if ttft else None, "decode_tps_mean": _mean(tps),
        "reuse_ratio": sum(r["reused_tokens"] for r in both) / prompt_both if prompt_both else None,
        "prompt_tokens": sum(r["prompt_tokens"] or 0 for r in ok),
        "reused_tokens": sum(r["reused_tokens"] or 0 for r in ok),
        "output_tokens": sum(r["output_tokens"] or 0 for r in ok),
        "wall_s": wall_s, "engine": engine_out,
        "interrupted_by": interrupted_by if interrupted else None,
        "warm_start": None, "warm_start_rule": None, "warm_start_evidence": None,
        "first_turn_warm": None, **(warm or {}),
        "request_options": request_options, "turn_keys_sha256": turn_keys_sha256,
        "server_moe": server_moe,
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


def _engine_lines(engine: dict) -> list[str]:
    """The engine paragraph: counters as deltas over the run, gauges as values at its end."""
    counters = [f"{k} {_number(engine[k])}" for k in COUNTERS if k in engine]
    gauges = [f"{k} {_number(engine[k])}" for k in GAUGES if k in engine]
    lines = ["", "Engine (FreeToken `/metrics`):", ""]
    if counters:
        lines.append("- counters, deltas over the run: " + ", ".join(counters))
    if engine.get("expert_hit_rate") is not None:
        lines.append(f"- expert_hit_rate {_number(engine['expert_hit_rate'])} "
                     "(hits / (hits + misses) over the run)")
    if gauges:
        lines.append("- prefix cache held at the end of the run (not deltas): "
                     + ", ".join(gauges))
    return lines


def _settings_lines(s: dict) -> list[str]:
    """The warm-start line (loud when warm) and the FreeToken MoE settings line."""
    lines = []
    if s.get("warm_start"):
        lines += [f"**{WARM_LINE}** (evidence: {s.get('warm_start_evidence')}).", ""]
    elif s.get("warm_start") is False:
        lines += [f"Cold start (evidence: {s.get('warm_start_evidence')}).", ""]
    else:
        lines += ["Warm start: unknown (no FreeToken `/metrics`, and no reused-token count from "
                  "the first turn).", ""]
    moe = moe_settings(s.get("server_moe"))
    if moe:
        lines += ["Server MoE settings (`/v1/freetoken/memory`): "
                  + ", ".join(f"{k} `{v}`" for k, v in moe.items()) + ".", ""]
    return lines


def summary_markdown(summary: dict, records: list[dict]) -> str:
    """``summary.md``: the run's settings, the summary table, engine totals and every turn.

    The header line names the traces source (``traces: real`` / ``traces: SYNTHETIC``); an
    interrupted run gets a note that the numbers cover the finished turns only; then a line on
    the warm start (:data:`evals.replay.warm.WARM_LINE` in bold when warm) and, for FreeToken,
    its MoE backend / expert format / CPU activations."""
    s = summary
    source = s.get("traces_source") or ("synthetic" if s["traces"] == "synthetic" else "real")
    tag = "traces: SYNTHETIC (not real agent traffic)" if source == "synthetic" else "traces: real"
    lines = [f"# {s['workload']} replay: {s['label']} ({tag})", ""]
    if s.get("interrupted"):
        lines += [f"**Interrupted** ({s.get('interrupted_by') or 'Ctrl-C'}) after {s['n_turns']} "
                  f"of {s.get('n_planned', '?')} planned turns: every number below covers the "
                  "finished turns only; there are no engine totals.", ""]
    lines += _settings_lines(s)
    lines += [
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
        lines += _engine_lines(s["engine"])
    lines += ["", "| # | call | prompt | reused | max_tokens | output | TTFT (s) | decode tok/s | "
              "edited | error |", "|---:|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in records:
        lines.append(
            f"| {r['index']} | {r['key']} | {fmt(r['prompt_tokens'])} | {fmt(r['reused_tokens'])} "
            f"| {r['max_tokens']} | {fmt(r['output_tokens'])} | {fmt(r['ttft_s'])} | "
            f"{fmt(r['decode_tps'], 1)} | {'yes' if r['edited'] else ''} | "
            f"{(r['error'] or '')[:80].replace('|', '/')} |")
    return "\n".join(lines) + "\n"


class TurnLog:
    """``turns.jsonl`` written as turns finish: one line per finished turn, flushed at once, so a
    crash or Ctrl-C keeps every finished turn (completion order; :func:`write_outputs` rewrites
    the file in plan order at the end).

    Raises:
        OSError: the file cannot be created.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def append(self, record: dict) -> None:
        """Write one record as a JSON line and flush it to the OS."""
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Close the file (idempotent)."""
        self._file.close()


def check_out_dir(path: Path, flag: str = "--out") -> None:
    """Check up front that ``path`` can be the output folder: it is a folder, or does not exist
    and its nearest existing parent is a writable folder (it is created later).

    Raises:
        ValueError: ``path`` exists and is not a folder, a parent is not a folder, or the folder
            that would hold it is not writable.
    """
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {path}: exists and is not a folder")
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ValueError(f"{flag} {path}: {probe} is not a folder")
    if probe.is_dir() and not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: {probe} is not writable")


def write_outputs(out: Path, records: list[dict], summary: dict) -> list[Path]:
    """Write turns.jsonl (plan order, replacing the one :class:`TurnLog` appended to),
    summary.json and summary.md under ``out`` (created); returns them."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "turns.jsonl", out / "summary.json", out / "summary.md"]
    tmp = out / "turns.jsonl.tmp"
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
                   encoding="utf-8")
    tmp.replace(paths[0])
    paths[1].write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    paths[2].write_text(summary_markdown(summary, records), encoding="utf-8")
    return paths


def load_run(run_dir: Path) -> tuple[dict, list[dict]]:
    """``(summary, turn records)`` of a run folder.

    Raises:
        FileNotFoundError: ``run_dir`` does not exist, or has no summary.json / turns.jsonl.
        ValueError: ``run_dir`` is not a folder, a file that is not JSON, or a summary without
            the keys of :data:`SUMMARY_KEYS`.
    """
    if not run_dir.exists():
        raise FileNotFoundError(f"{run_dir}: no such folder")
    if not run_dir.is_dir():
        raise ValueError(f"{run_dir} is a file, not a run folder (pass the --out folder of "
                         "evals/run.py)")
    for name in ("summary.json", "turns.jsonl"):
        if not (run_dir / name).is_file():
            raise FileNotFoundError(f"{run_dir}: no {name} (not an evals/run.py output folder)")
    try:
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"{run_dir}/summary.json is not JSON ({exc})") from None
    if not isinstance(summary, dict):
        raise ValueError(f"{run_dir}/summary.json is not a JSON object")
    missing = [k for k in SUMMARY_KEYS if k not in summary]
    if missing:
        raise ValueError(f"{run_dir}/summary.json lacks {', '.join(missing)}")
    try:
        records = [json.loads(line) for line in
                   (run_dir / "turns.jsonl").read_text(encoding="utf-8").splitlines() if line]
    except ValueError as exc:
        raise ValueError(f"{run_dir}/turns.jsonl has a line that is not JSON ({exc})") from None
    return summary, records
