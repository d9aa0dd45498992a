"""One replay run end to end: check the output folder, resolve the traces, build the plan and the
requests, check the endpoint (``GET /v1/models``), run the turns with a progress bar while
appending each finished turn to ``turns.jsonl``, write the outputs. ``evals/run.py`` is the command
line over :func:`run_workload`.

Ctrl-C during the replay stops it cleanly: the outputs are written from the finished turns with
``"interrupted": true`` in the summary (:func:`run_workload` returns it; the command exits 130).
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from evals.replay.endpoint import fetch_model_list, first_model_id, normalize_endpoint
from evals.replay.plots import plot_run
from evals.replay.report import TurnLog, check_out_dir, summarize, write_outputs
from evals.replay.runner import RunConfig, replay
from evals.replay.synthetic import write_synthetic_traces
from evals.replay.turns import RequestOptions, build_request
from evals.replay.workloads import DEFAULT_PROTOCOL, build_plan
from freetoken.paths import shared_dir


@dataclass(frozen=True)
class RunOptions:
    """Everything a run needs (the command-line options of ``evals/run.py``).

    Attributes:
        workload: ``"W1"`` .. ``"W4"``.
        endpoint: base URL of the engine, without ``/v1`` (``endpoint.normalize_endpoint``).
        out: output folder.
        protocol: None: the workload's default (W3 anthropic, others openai).
        traces: traces folder (must exist); ``"synthetic"``: the built-in synthetic set; None:
            :func:`default_traces` when it exists, else the synthetic set (a warning on stderr).
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
        timeout_s: per-request timeout (s, the whole request).
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
    """``$FREETOKEN_SHARED/traces``, else ``<repo>/../shared/traces`` (``freetoken.paths.
    shared_dir``; may not exist, e.g. in a clone outside the workspace)."""
    return shared_dir() / "traces"


def synthetic_warning(path: Path) -> str:
    """The stderr line of a run that falls back to the synthetic set."""
    return (f"run: no traces folder at {path}; replaying the built-in SYNTHETIC set (not real "
            "agent traffic); pass --traces DIR or set FREETOKEN_SHARED")


def resolve_traces(value: str | None, out: Path) -> tuple[Path, bool]:
    """``(traces folder, synthetic?)``.

    ``value`` None: the default folder when it exists, else the synthetic set written to
    ``out/synthetic-traces`` with :func:`synthetic_warning` on stderr. ``"synthetic"``: the
    synthetic set (a note on stderr). Any other value must be an existing folder.

    Raises:
        FileNotFoundError: an explicit ``value`` that does not exist.
        ValueError: an explicit ``value`` that is not a folder.
    """
    if value == "synthetic":
        print("run: --traces synthetic: replaying the built-in SYNTHETIC set (not real agent "
              "traffic)", file=sys.stderr)
    elif value:
        path = Path(value)
        if not path.exists():
            raise FileNotFoundError(f"--traces {value}: no such folder")
        if not path.is_dir():
            raise ValueError(f"--traces {value}: not a folder")
        return path, False
    else:
        path = default_traces()
        if path.is_dir():
            return path, False
        print(synthetic_warning(path), file=sys.stderr)
    return write_synthetic_traces(out / "synthetic-traces"), True


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

    Nothing is sent before the output folder, the traces and the endpoint were checked. Each
    finished turn is appended to ``turns.jsonl`` at once; on Ctrl-C (KeyboardInterrupt) during
    the replay the outputs are written from the finished turns and the summary has
    ``"interrupted": true``.

    Returns:
        The summary (``summary.json``'s object).

    Raises:
        ValueError / FileNotFoundError: bad options, output folder or traces (see
            ``build_plan``, ``check_out_dir``, ``resolve_traces``).
        endpoint.EndpointError (a ValueError): the endpoint is unreachable, wants an API key or
            serves no OpenAI model list.
    """
    if opts.workload not in DEFAULT_PROTOCOL:
        raise ValueError(f"unknown workload {opts.workload!r}; expected one of "
                         f"{', '.join(DEFAULT_PROTOCOL)}")
    if opts.timeout_s <= 0:
        raise ValueError(f"timeout must be > 0 s, got {opts.timeout_s}")
    endpoint = normalize_endpoint(opts.endpoint)
    check_out_dir(opts.out)
    protocol = opts.protocol or DEFAULT_PROTOCOL[opts.workload]
    concurrency = opts.concurrency if opts.concurrency is not None else \
        (0 if opts.workload == "W3" else 1)
    traces, synthetic = resolve_traces(opts.traces, opts.out)
    calls = build_plan(opts.workload, traces, limit=opts.limit_turns, select=opts.select)
    listed = fetch_model_list(endpoint, opts.api_key)
    model = opts.model or first_model_id(listed) or "default"
    req_opts = RequestOptions(protocol, model, opts.ignore_eos, opts.edits, opts.w1_max_tokens,
                              opts.temperature)
    requests = [build_request(c, req_opts) for c in calls]
    label = opts.label or endpoint.split("://")[-1]
    cfg = RunConfig(endpoint, protocol, opts.api_key, concurrency, opts.timeout_s,
                    harness_header=opts.harness_header)
    done: list[dict] = []
    log = TurnLog(opts.out / "turns.jsonl")
    bar, on_bar = _progress(len(requests), f"{opts.workload} {label}") if opts.progress \
        else (None, None)

    def on_done(record: dict) -> None:
        done.append(record)
        log.append(record)
        if on_bar is not None:
            on_bar(record)

    t0 = time.perf_counter()
    interrupted = False
    try:
        if bar is not None:
            with bar:
                records, engine = asyncio.run(replay(requests, cfg, on_done))
        else:
            records, engine = asyncio.run(replay(requests, cfg, on_done))
    except KeyboardInterrupt:
        interrupted = True
        records, engine = sorted(done, key=lambda r: r["index"]), None
    finally:
        log.close()
    wall = time.perf_counter() - t0
    summary = summarize(records, workload=opts.workload, endpoint=endpoint, label=label,
                        protocol=protocol, model=model,
                        traces="synthetic" if synthetic else str(traces.resolve()),
                        traces_source="synthetic" if synthetic else "real",
                        concurrency=concurrency, wall_s=wall, engine=engine,
                        n_planned=len(requests), interrupted=interrupted)
    write_outputs(opts.out, records, summary)
    plot_run(opts.out, records, f"{opts.workload} {label}")
    return summary
