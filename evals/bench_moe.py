"""The MoE benchmark of issue 3, all three items in one run (each also runs on its own).

1. ``evals.bench_moe_kernel``: CPU expert kernel effective bandwidth / this machine's memory-copy
   bandwidth per weight format, next to a plain torch per-expert implementation.
2. ``evals.bench_moe_decode``: decode step time of the small model per backend and cache fraction
   (10/25/50/100%), the online split against the best fixed strategy, tokens vs resident.
3. ``evals.bench_moe_replay``: miss rate of each eviction policy and baseline at equal capacity on
   routing recorded by the engine while serving real trace text from ../shared/traces.

Run: ``python -m evals.bench_moe [--items 1 2 3]`` (about 10 minutes on the 2-core dev machine;
item 2 generates the small checkpoint on first use). Every item prints its own table; ratios are
always against baselines measured in the same run.
"""

from __future__ import annotations

import argparse
import time


def main(argv: list[str] | None = None) -> None:
    """Run the selected items with their default settings."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, nargs="+", default=[1, 2, 3], choices=[1, 2, 3])
    args = parser.parse_args(argv)
    for item in args.items:
        started = time.perf_counter()
        print(f"\n=== MoE benchmark item {item} ===", flush=True)
        if item == 1:
            from evals import bench_moe_kernel

            bench_moe_kernel.run(bench_moe_kernel.build_parser().parse_args([]))
        elif item == 2:
            from evals import bench_moe_decode

            decode_parser = argparse.ArgumentParser()
            bench_moe_decode.add_arguments(decode_parser)
            bench_moe_decode.run(decode_parser.parse_args([]))
        else:
            from evals import bench_moe_replay

            bench_moe_replay.run(bench_moe_replay.parse_args([]))
        print(f"(item {item}: {time.perf_counter() - started:.0f}s)", flush=True)


if __name__ == "__main__":
    main()
