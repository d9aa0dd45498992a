"""Put several replay runs of ``evals/run.py`` side by side.

Usage (with the project's venv python)::

    .venv/bin/python evals/compare.py OUT_A OUT_B ... [--out DIR]

Writes DIR/compare.md (a table: traces source, protocol, turns, failed turns, TTFT
mean/p50/max, decode tok/s, reuse ratio, and ratios of mean TTFT and decode tok/s against the
first run, left blank for a run that is not comparable with it, e.g. other request options or a
warm start against a cold one: ``evals/replay/comparison.py``; a second table: each run's warm
or cold start and FreeToken MoE backend / expert format / CPU activations; a caveat line when a
run started warm) and DIR/compare.png (labelled as the table), and prints both tables. DIR
defaults to the first run's folder. Exit status 2 when a folder is not a run (or a file), or DIR
cannot be an output folder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evals.replay.comparison import compare_runs  # noqa: E402
from evals.replay.report import check_out_dir  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    p = argparse.ArgumentParser(prog="evals/compare.py", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path,
                   help="run folders of evals/run.py (the first is the baseline)")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: the first run's folder)")
    args = p.parse_args(argv)
    try:
        if args.out is not None:
            check_out_dir(args.out)
        md, png, table = compare_runs(args.runs, args.out or args.runs[0])
    except (OSError, ValueError) as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 2
    print(table)
    print(f"wrote {md} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
