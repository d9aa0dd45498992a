"""MoE benchmark item 2: decode step time per backend and cache fraction (issue 3).

Loads the ``small`` qwen3_next preset (12 MoE layers x 64 experts, top-8, 1.21 GB of bf16 routed
experts; generated into the FreeToken cache on first use, ~1 min) once resident and once with
offloaded experts, then for every cache fraction (10/25/50/100% of all experts) and every miss
strategy times greedy decode steps:

* ``offload`` (every miss filled), ``cpu`` (every miss on the CPU kernel), ``static`` (the
  profile's q* = round(m * B_P / B_H), never corrected), ``hybrid`` (q* with the online
  correction);
* ``resident`` (every expert a device parameter) is the baseline of the ``x res`` column.

Each configuration starts from the same state (cache resized to the fraction and preloaded with
the same uniform hot set, fresh split), prefills the same prompt, decodes ``--warmup`` steps
untimed, then times ``--steps`` steps (median ms/step). Every configuration must produce the
resident model's tokens (column ``same``). The last column, ``hyb/best``, is the online split's
time over the best fixed strategy (offload, cpu, static) at that fraction: the issue's bar is
<= 1.05. B_P / B_H come from the stored profile (``freetoken profile``) when there is one, else
0.5 (printed).

On a CPU-only machine the "device" is the CPU too: fills are memory copies into the pool and the
device branch is torch on the engine thread, running beside the kernel's thread pool.

Run: ``python -m evals.bench_moe_decode [--model DIR] [--steps 24]`` (~3-5 min here).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from freetoken.models.registry import load_model
from freetoken.offload.backend import MoeConfig
from freetoken.offload.policies import uniform_hot_set
from freetoken.offload.split import MissSplit

FRACTIONS = (0.10, 0.25, 0.50, 1.00)
STRATEGIES = (("offload", "all-fill"), ("cpu", "all-cpu"), ("static", "static"),
              ("hybrid", "split"))
PROMPT = [5, 17, 300, 42, 8000, 12, 99, 1000, 7, 7, 2048, 31, 640, 3, 77, 1500]


def small_model(progress=print) -> Path:
    """The ``small`` qwen3_next checkpoint from the FreeToken cache (generated on first use)."""
    from freetoken.models.tiny import cached_tiny

    return cached_tiny("qwen3_next", "small", progress=progress)


def decode(model, steps: int, warmup: int) -> tuple[list[int], list[float]]:
    """Greedy decode after PROMPT; returns (tokens, per-step seconds of the timed steps)."""
    runtime = model.moe_runtime
    state = model.new_state()
    device = model.embed.device
    ids = torch.tensor(PROMPT, device=device)
    tokens, times = [], []
    for i in range(warmup + steps):
        started = time.perf_counter()
        if runtime is not None:
            runtime.begin_step()
        logits = model(ids, state)
        if runtime is not None:
            runtime.end_step()
        tokens.append(int(logits[-1].argmax()))  # syncs the device
        if i >= warmup:
            times.append(time.perf_counter() - started)
        ids = torch.tensor([tokens[-1]], device=device)
    return tokens, times


def reset(runtime, fraction: float, mode: str, ratio: float, eta: float) -> None:
    """Cache of ``fraction`` of all experts, preloaded with the uniform hot set; fresh split."""
    banks = runtime.banks
    slots = max(1, round(fraction * banks.num_ids))
    runtime.resize_now(slots * runtime.cache.slot_bytes)
    hot = uniform_hot_set(banks.num_layers, banks.num_experts, slots)
    runtime.cache.preload(torch.from_numpy(hot))
    runtime.split = MissSplit(mode, ratio=ratio, eta=eta)
    for counts in runtime._counts.values():
        counts[:] = 0


def hit_rate(runtime) -> float:
    """Hits / routed experts since the last reset."""
    hits, misses = int(runtime._counts["hits"].sum()), int(runtime._counts["misses"].sum())
    return hits / (hits + misses) if hits + misses else 0.0


def run(args: argparse.Namespace) -> list[dict]:
    """Time every configuration; returns one row per (fraction, strategy) plus the resident row."""
    path = Path(args.model) if args.model else small_model()
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    ratio = args.ratio
    if ratio is None:
        ratio = 0.5
        try:
            from freetoken.offload.profile import default_profile_path, load_profile

            from freetoken.offload.loading import planned_bank_dtype

            bank = planned_bank_dtype(path, args.dtype)
            profile = load_profile(default_profile_path(path, args.device.split(":")[0], bank))
            if profile is not None:
                ratio = profile.bandwidth_p_gbps / profile.bandwidth_h_gbps
        except (ImportError, ValueError, TypeError):
            pass
    print(f"model {path} ({args.dtype}, {args.device}); split ratio B_P/B_H = {ratio:.3f}; "
          f"{args.steps} timed steps after {args.warmup}")
    resident = load_model(path, dtype=dtype, device=args.device)
    ref_tokens, ref_times = decode(resident, args.steps, args.warmup)
    del resident
    base = statistics.median(ref_times)
    rows = [dict(fraction=1.0, strategy="resident", ms=base * 1e3, hit_rate=1.0, same=True,
                 ratio_resident=1.0)]
    model = load_model(path, dtype=dtype, device=args.device,
                       moe=MoeConfig(backend="hybrid", cache="1.0"))
    runtime = model.moe_runtime
    for fraction in args.fractions:
        for name, mode in STRATEGIES:
            reset(runtime, fraction, mode, ratio, args.eta)
            tokens, times = decode(model, args.steps, args.warmup)
            ms = statistics.median(times) * 1e3
            rows.append(dict(fraction=fraction, strategy=name, ms=ms, hit_rate=hit_rate(runtime),
                             same=tokens == ref_tokens, ratio_resident=ms / (base * 1e3),
                             split_ratio=runtime.split.ratio))
    print_table(rows)
    return rows


def print_table(rows: list[dict]) -> None:
    """Printed table: ms/step, x resident, hit rate, identical tokens, hybrid / best fixed."""
    print(f"{'cache':>6} {'strategy':>9} {'ms/step':>8} {'x res':>6} {'hit':>6} {'same':>5} "
          f"{'r end':>6} {'hyb/best':>8}")
    by_fraction: dict[float, dict[str, float]] = {}
    for row in rows:
        by_fraction.setdefault(row["fraction"], {})[row["strategy"]] = row["ms"]
    for row in rows:
        extra = ""
        times = by_fraction[row["fraction"]]
        if row["strategy"] == "hybrid":
            best = min(times[s] for s in ("offload", "cpu", "static") if s in times)
            row["hybrid_over_best"] = row["ms"] / best
            extra = f"{row['hybrid_over_best']:8.3f}"
        r_end = f"{row['split_ratio']:6.3f}" if "split_ratio" in row else "     -"
        print(f"{row['fraction']:6.0%} {row['strategy']:>9} {row['ms']:8.1f} "
              f"{row['ratio_resident']:6.2f} {row['hit_rate']:6.3f} {str(row['same']):>5} "
              f"{r_end} {extra}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of this benchmark (shared with ``evals.bench_moe``)."""
    parser.add_argument("--model", default=None, help="checkpoint dir (default: small preset)")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="float32",
                        help="compute dtype (default float32: the token check is exact there)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:i]")
    parser.add_argument("--steps", type=int, default=24, help="timed decode steps")
    parser.add_argument("--warmup", type=int, default=8, help="untimed decode steps first")
    parser.add_argument("--fractions", type=float, nargs="+", default=list(FRACTIONS))
    parser.add_argument("--ratio", type=float, default=None, help="B_P/B_H override")
    parser.add_argument("--eta", type=float, default=0.3, help="online split gain")


def main() -> None:
    """CLI entry: ``python -m evals.bench_moe_decode``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    run(parser.parse_args())


if __name__ == "__main__":
    main()
