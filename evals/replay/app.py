"""One replay run end to end: resolve the traces, build the plan and the requests, run them with
a progress bar, write the outputs. ``evals/run.py`` is the command line over :func:`run_workload`.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from evals.replay.client import headers
from evals.replay.plots import plot_run
from evals.replay.report import summarize, write_outputs
from evals.replay.runner import RunConfig, replay
from evals.replay.synthetic import write_synthetic_traces
from evals.replay.turns import RequestOptions, build_request
from evals.replay.workloads import DEFAULT_PROTOCOL, build_plan

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class RunOptions:
    """Everything a run needs (the command-line options of ``evals/run.py``).

    Attributes:
        workload: ``"W1"`` .. ``"W4"``.
        endpoint: base URL of the engine.
        out: output folder.
        protocol: None: the workload's default (W3 anthropic, others openai).
        traces: traces folder; None: ``$FREETOKEN_SHARED/traces`` or ``<repo>/../shared/traces``
            when present; the synthetic set when the folder is missing or the value is
            ``"synthetic"``.
        limit_turns: replay only the first N calls (None: all).
        concurrency: most turns in flight (None: W3 0 = as recorded, others 1).
        model: ``model`` field (None: the first id of ``GET /v1/models``, else ``"default"``).
        api_key: sent as Bearer / x-api-key.
        label: run name in the reports (None: the endpoint's host:port).
        w1_max_tokens: max_tokens of calls without a recorded response.
        ignore_eos: send ``ignore_eos: true``.
        edits: apply the harness edit simulators.
        select: keep only sessions whose name contains one of these.
        harness_header: send ``X-FreeToken-Harness: <adapter>`` (a FreeToken extension).
        progress: show the progress bar (stderr).
        timeout_s: per-request timeout.
        temperature: sampling temperature sent.
    """

    workload: str
    endpoint: str
    out: Path
    protocol: str | None = None
    traces: str | None = None
    limit_turns: int | None = None
    concurrency: int | None = None
    model: str | None = None
    api_key: str | None = None
    label: str | None = None
    w1_max_tokens: int = 512
    ignore_eos: bool = True
    edits: bool = True
    select: tuple[str, ...] = field(default=())
    harness_header: bool = False
    progress: bool = True
    timeout_s: float = 600.0
    temperature: float = 1.0


def default_traces() -> Path:
    """``$FREETOKEN_SHARED/traces``, else ``<repo>/../shared/traces`` (may not exist)."""
    shared = os.environ.get("FREETOKEN_SHARED")
    return (Path(shared) if shared else REPO_ROOT.parent / "shared") / "traces"


def resolve_traces(value: str | None, out: Path) -> tuple[Path, bool]:
    """``(traces folder, synthetic?)``: the given or default folder when it exists, else the
    synthetic set written to ``out/synthetic-traces`` (a note goes to stderr when a given
    folder is missing)."""
    if value != "synthetic":
        path = Path(value) if value else default_traces()
        if path.is_dir():
            return path, False
        if value:
            print(f"run: no traces folder at {path}; using the built-in synthetic set",
                  file=sys.stderr)
    return write_synthetic_traces(out / "synthetic-traces"), True


def served_model(endpoint: str, hdrs: dict[str, str], timeout_s: float = 10.0) -> str:
    """The first model id of ``GET /v1/models`` (OpenAI or Anthropic list shape), else
    ``"default"``."""
    try:
        resp = httpx.get(f"{endpoint.rstrip('/')}/v1/models", headers=hdrs, timeout=timeout_s)
        data = resp.json().get("data") if resp.status_code == 200 else None
        if data and isinstance(data[0], dict) and data[0].get("id"):
            return str(data[0]["id"])
    except (httpx.HTTPError, ValueError, AttributeError):
        pass
    return "default"


def _progress(total: int, title: str):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TextColumn("{task.fields[last]}"),
                   console=Console(stderr=True), transient=False)
    task = bar.add_task(title, total=total, last="")

    def done(record: dict) -> None:
        ttft = record["ttft_s"]
        last = f"{record['key']}: " + (f"error {record['status']}" if record["error"] else
                                       f"TTFT {ttft:.3f}s" if ttft is not None else "no output")
        bar.update(task, advance=1, last=last)

    return bar, done


def run_workload(opts: RunOptions) -> dict:
    """Replay ``opts.workload`` against ``opts.endpoint`` and write turns.jsonl, summary.json,
    summary.md, ttft.png, decode_tps.png and reuse.png under ``opts.out``.

    Returns:
        The summary (``summary.json``'s object).

    Raises:
        ValueError / FileNotFoundError: bad options or traces (see ``build_plan``).
    """
    if opts.workload not in DEFAULT_PROTOCOL:
        raise ValueError(f"unknown workload {opts.workload!r}; expected one of "
                         f"{', '.join(DEFAULT_PROTOCOL)}")
    protocol = opts.protocol or DEFAULT_PROTOCOL[opts.workload]
    concurrency = opts.concurrency if opts.concurrency is not None else \
        (0 if opts.workload == "W3" else 1)
    traces, synthetic = resolve_traces(opts.traces, opts.out)
    calls = build_plan(opts.workload, traces, limit=opts.limit_turns, select=opts.select)
    hdrs = headers(protocol, opts.api_key)
    model = opts.model or served_model(opts.endpoint, hdrs)
    req_opts = RequestOptions(protocol, model, opts.ignore_eos, opts.edits, opts.w1_max_tokens,
                              opts.temperature)
    requests = [build_request(c, req_opts) for c in calls]
    label = opts.label or opts.endpoint.split("://")[-1].rstrip("/")
    cfg = RunConfig(opts.endpoint, protocol, opts.api_key, concurrency, opts.timeout_s,
                    harness_header=opts.harness_header)
    t0 = time.perf_counter()
    if opts.progress:
        bar, on_done = _progress(len(requests), f"{opts.workload} {label}")
        with bar:
            records, engine = asyncio.run(replay(requests, cfg, on_done))
    else:
        records, engine = asyncio.run(replay(requests, cfg))
    wall = time.perf_counter() - t0
    summary = summarize(records, workload=opts.workload, endpoint=opts.endpoint, label=label,
                        protocol=protocol, model=model,
                        traces="synthetic" if synthetic else str(traces),
                        concurrency=concurrency, wall_s=wall, engine=engine)
    write_outputs(opts.out, records, summary)
    plot_run(opts.out, records, f"{opts.workload} {label}")
    return summary
