"""One replay run end to end: check the output folder, resolve the traces, build the plan and the
requests, check the endpoint (``GET /v1/models``), run the turns with a progress bar while
appending each finished turn to ``turns.jsonl``, write the outputs. ``evals/run.py`` is the command
line over :func:`run_workload`.

Ctrl-C (or SIGTERM, :mod:`evals.replay.signals`) during the replay stops it cleanly: the outputs
are written from the finished turns with ``"interrupted": true`` in the summary
(:func:`run_workload` returns it; the command exits 130, or 143 after SIGTERM).

The summary also records what makes two runs comparable: the request-shaping options
(:func:`request_options`), a digest of the planned turn keys, whether the endpoint started warm
(:mod:`evals.replay.warm`) and FreeToken's MoE settings (``GET /v1/freetoken/memory``).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from evals.replay.endpoint import (
    fetch_model_list, fetch_server_moe, first_model_id, normalize_endpoint,
)
from evals.replay.plots import plot_run
from evals.replay.report import TurnLog, check_out_dir, summarize, turn_keys_digest, write_outputs
from evals.replay.runner import RunConfig, replay
from evals.replay.signals import Interrupts
from evals.replay.synthetic import write_synthetic_traces
from evals.replay.turns import RequestOptions, build_request
from evals.replay.warm import warm_start
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


def request_options(opts: RunOptions, concurrency: int, model: str) -> dict:
    """The options that shape what a run sends (``summary.json`` ``request_options``): two runs
    whose values differ did not replay the same requests. ``concurrency`` and ``model`` are the
    resolved values (the model name actually sent)."""
    return {"select": list(opts.select), "edits": opts.edits, "ignore_eos": opts.ignore_eos,
            "temperature": opts.temperature, "concurrency": concurrency,
            "w1_max_tokens": opts.w1_max_tokens, "limit_turns": opts.limit_turns,
            "harness_header": opts.harness_header, "model": model}


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


def run_workload(opts: RunOptions, interrupts: Interrupts | None = None) -> dict:
    """Replay ``opts.workload`` against ``opts.endpoint`` and write turns.jsonl, summary.json,
    summary.md, ttft.png, decode_tps.png and reuse.png under ``opts.out``.

    Nothing is sent before the output folder, the traces and the endpoint were checked. Each
    finished turn is appended to ``turns.jsonl`` at once; on Ctrl-C (KeyboardInterrupt) or
    SIGTERM during the replay the outputs are written from the finished turns and the summary
    has ``"interrupted": true`` and ``interrupted_by`` (``"Ctrl-C"`` / ``"SIGTERM"``).
    ``interrupts``: an active :class:`~evals.replay.signals.Interrupts` of the caller (the
    command line's, which picks the exit status); None: one is made for the replay.

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
    server_moe = fetch_server_moe(endpoint, opts.api_key)
    req_opts = RequestOptions(protocol, model, opts.ignore_eos, opts.edits, opts.w1_max_tokens,
                              opts.temperature)
    requests = [build_request(c, req_opts) for c in calls]
    label = opts.label or endpoint.split("://")[-1]
    cfg = RunConfig(endpoint, protocol, opts.api_key, concurrency, opts.timeout_s,
                    harness_header=opts.harness_header)
    done: list[dict] = []
    first_scrape: list[dict | None] = [None]
    log = TurnLog(opts.out / "turns.jsonl")
    bar, on_bar = _progress(len(requests), f"{opts.workload} {label}") if opts.progress \
        else (None, None)

    def on_done(record: dict) -> None:
        done.append(record)
        log.append(record)
        if on_bar is not None:
            on_bar(record)

    def on_start(scraped: dict | None) -> None:
        first_scrape[0] = scraped

    t0 = time.perf_counter()
    interrupted = False
    guard = Interrupts() if interrupts is None else contextlib.nullcontext(interrupts)
    with guard as intr:
        try:
            if bar is not None:
                with bar:
                    records, engine = asyncio.run(replay(requests, cfg, on_done, on_start))
            else:
                records, engine = asyncio.run(replay(requests, cfg, on_done, on_start))
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
                        n_planned=len(requests), interrupted=interrupted,
                        interrupted_by=intr.cause() if interrupted else None,
                        warm=warm_start(first_scrape[0], records),
                        request_options=request_options(opts, concurrency, model),
                        turn_keys_sha256=turn_keys_digest([r.call.key for r in requests]),
                        server_moe=server_moe)
    write_outputs(opts.out, records, summary)
    plot_run(opts.out, records, f"{opts.workload} {label}")
    return summary
