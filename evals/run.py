"""Replay a workload (W1-W4) of recorded agent conversations against an endpoint.

Usage (with the project's venv python)::

    .venv/bin/python evals/run.py --workload W2 --endpoint http://127.0.0.1:8300 --limit-turns 5 \
        --out /tmp/w2

Writes OUT/turns.jsonl (a line per finished turn, appended as it finishes), OUT/summary.md,
OUT/summary.json, OUT/ttft.png, OUT/decode_tps.png and OUT/reuse.png. Exit status: 0 when every
turn succeeded, 1 when some failed (the files are still written), 2 for bad options, traces,
output folder or endpoint (checked before any request), 130 on Ctrl-C and 143 on SIGTERM (both
the same clean stop: the files are written from the finished turns, ``"interrupted": true``).
summary.json also records whether the endpoint started warm (``warm_start``), the
request-shaping options and FreeToken's MoE settings. What is sent and measured: evals/README.md
("W1-W4 replay") and the docstrings of ``evals/replay/``.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evals.replay.app import RunOptions, run_workload  # noqa: E402
from evals.replay.endpoint import EndpointError, api_key_or_env, normalize_endpoint  # noqa: E402
from evals.replay.report import check_out_dir, fmt  # noqa: E402
from evals.replay.signals import Interrupts  # noqa: E402
from evals.replay.warm import WARM_LINE  # noqa: E402
from evals.replay.workloads import WORKLOADS  # noqa: E402
from freetoken.cli import int_at_least  # noqa: E402

_positive = int_at_least(1)
_non_negative = int_at_least(0)


def positive_seconds(text: str) -> float:
    """argparse ``type``: a float > 0 (seconds); ArgumentTypeError (exit 2) otherwise."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text}")
    return value


def parser() -> argparse.ArgumentParser:
    """The command line (``--help`` lists every option with its default)."""
    p = argparse.ArgumentParser(prog="evals/run.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", required=True, choices=WORKLOADS)
    p.add_argument("--endpoint", required=True,
                   help="base URL of the engine, e.g. http://127.0.0.1:8300 (FreeToken or any "
                        "OpenAI/Anthropic-compatible server; a trailing /v1 is dropped)")
    p.add_argument("--protocol", choices=["openai", "anthropic"], default=None,
                   help="wire protocol (default: anthropic for W3, openai otherwise)")
    p.add_argument("--traces", default=None,
                   help="traces folder, or 'synthetic' for the built-in synthetic set (default: "
                        "$FREETOKEN_SHARED/traces, else <repo>/../shared/traces; when that "
                        "default folder is missing the synthetic set is used, with a warning; a "
                        "given folder must exist)")
    p.add_argument("--limit-turns", type=_positive, default=None,
                   help="replay only the first N model calls of the workload (default: all)")
    p.add_argument("--concurrency", type=_non_negative, default=None,
                   help="most requests in flight (0: as recorded; default: 0 for W3, 1 otherwise)")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: replay-out/<workload>-<label>)")
    p.add_argument("--model", default=None,
                   help="model name sent (default: the first id of GET /v1/models)")
    p.add_argument("--api-key", default=None,
                   help="API key, sent as Bearer and x-api-key (default: $FREETOKEN_API_KEY, "
                        "else none)")
    p.add_argument("--label", default=None,
                   help="run name in the reports (default: the endpoint's host:port)")
    p.add_argument("--w1-max-tokens", type=_positive, default=512,
                   help="output budget of calls without a recorded response (W1; default: 512)")
    p.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="do not send ignore_eos: true (for peers that reject unknown fields; "
                        "default: sent)")
    p.add_argument("--no-edits", dest="edits", action="store_false",
                   help="send the recorded histories without the harness edit simulators "
                        "(default: edits applied)")
    p.add_argument("--select", action="append", default=[], metavar="SUBSTRING",
                   help="only sessions whose name contains SUBSTRING (repeatable; default: all)")
    p.add_argument("--harness-header", action="store_true",
                   help="send X-FreeToken-Harness: <adapter> with every request (default: off)")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="sampling temperature sent (default: 1.0, the APIs' default)")
    p.add_argument("--timeout", type=positive_seconds, default=600.0,
                   help="per-request timeout in seconds: the whole request, sent to stream end; "
                        "a turn that takes longer is recorded as failed (default: 600)")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar (default: a progress bar on stderr)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (module docstring)."""
    p = parser()
    args = p.parse_args(argv)
    try:
        endpoint = normalize_endpoint(args.endpoint)
    except EndpointError as exc:
        p.error(str(exc))
    label = args.label or re.sub(r"[^A-Za-z0-9._-]+", "_", endpoint.split("://")[-1])
    out = args.out or Path("replay-out") / f"{args.workload}-{label}"
    opts = RunOptions(
        workload=args.workload, endpoint=endpoint, out=out, protocol=args.protocol,
        traces=args.traces, limit_turns=args.limit_turns, concurrency=args.concurrency,
        model=args.model, api_key=api_key_or_env(args.api_key), label=args.label,
        w1_max_tokens=args.w1_max_tokens, ignore_eos=args.ignore_eos, edits=args.edits,
        select=tuple(args.select), harness_header=args.harness_header, progress=args.progress,
        timeout_s=args.timeout, temperature=args.temperature)
    with Interrupts() as intr:
        try:
            check_out_dir(out)
            s = run_workload(opts, intr)
        except (ValueError, FileNotFoundError) as exc:  # EndpointError is a ValueError
            print(f"run: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print(f"run: interrupted ({intr.cause()}) before the first turn; nothing written",
                  file=sys.stderr)
            return intr.exit_status()
    print(f"{s['workload']} {s['label']}: {s['n_turns']} turns ({s['n_failed']} failed), "
          f"TTFT mean {fmt(s['ttft_mean_s'])} s / p50 {fmt(s['ttft_p50_s'])} s / max "
          f"{fmt(s['ttft_max_s'])} s, decode {fmt(s['decode_tps_mean'], 1)} tok/s, reuse "
          f"{fmt(s['reuse_ratio'])}; traces: {s['traces_source']}"
          f"{'; WARM start' if s['warm_start'] else ''}"
          f"{'; INTERRUPTED' if s['interrupted'] else ''}; wrote {out}")
    if s["warm_start"]:
        print(f"run: {WARM_LINE} ({s['warm_start_evidence']})", file=sys.stderr)
    if s["interrupted"]:
        print(f"run: interrupted ({s['interrupted_by']}) after {s['n_turns']} of "
              f"{s['n_planned']} turns; the finished turns are in {out}/turns.jsonl, "
              "summary.json has \"interrupted\": true", file=sys.stderr)
        return intr.exit_status()
    return 1 if s["n_failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
