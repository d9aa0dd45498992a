"""MoE benchmark item 2: decode step time per backend and cache fraction (issue 3).

Loads the ``small`` qwen3_next preset (12 MoE layers x 64 experts, top-8, 1.21 GB of bf16 routed
experts; generated into the FreeToken cache on first use, ~1 min) once resident and once with
offloaded experts, then for every cache fraction (10/25/50/100% of all experts) and every miss
strategy times greedy decode steps:

* ``offload`` (every miss filled), ``cpu`` (every miss on the CPU kernel), ``static`` (the
  profile's q* = round(m * B_P / B_H), never corrected), ``hybrid`` (q* with the online
  correction);
* ``resident`` (every expert a device parameter) is the baseline of the ``x res`` column.

Each configuration (a "lane") has its own expert cache of the fraction, preloaded with the same
uniform hot set, its own split and its own sequence, all over one set of host banks; the lanes
(resident included) prefill the same prompt and then decode step by step in turn, the order
rotating every step, so the shared machine's slow drifts hit them all alike. ``--warmup`` steps
are untimed, then ``--steps`` steps are timed; the table shows the median ms/step. Every configuration must produce the
resident model's tokens (column ``same``). The last column, ``hyb/best``, is the online split's
time over the best fixed strategy (offload, cpu, static) at that fraction: the issue's bar is
<= 1.05. B_P / B_H come from the stored profile (``freetoken profile``) when there is one, else
0.5 (printed).

On a CPU-only machine the "device" is the CPU too: fills are memory copies into the pool and the
device branch is torch on the engine thread, running beside the kernel's thread pool.

Run: ``python -m evals.bench_moe_decode [--model DIR] [--steps 48]`` (~5 min here).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from freetoken.models.registry import load_model
from freetoken.offload.backend import MoeConfig
from freetoken.offload.cache import ExpertCache
from freetoken.offload.policies import uniform_hot_set
from freetoken.offload.runtime import OffloadRuntime
from freetoken.offload.scores import make_scores
from freetoken.offload.split import MissSplit

FRACTIONS = (0.10, 0.25, 0.50, 1.00)
STRATEGIES = (("offload", "all-fill"), ("cpu", "all-cpu"), ("static", "static"),
              ("hybrid", "split"))
PROMPT = [5, 17, 300, 42, 8000, 12, 99, 1000, 7, 7, 2048, 31, 640, 3, 77, 1500]


def small_model(progress=print) -> Path:
    """The ``small`` qwen3_next checkpoint from the FreeToken cache (generated on first use)."""
    from freetoken.models.tiny import cached_tiny

    return cached_tiny("qwen3_next", "small", progress=progress)


class Lane:
    """One configuration decoding its own sequence: a model (and, offloaded, its own runtime)."""

    def __init__(self, name: str, model, runtime=None) -> None:
        self.name, self.model, self.runtime = name, model, runtime
        self.device = model.embed.device
        self.state = model.new_state()
        self.ids = torch.tensor(PROMPT, device=self.device)
        self.tokens: list[int] = []
        self.times: list[float] = []

    def step(self, timed: bool) -> None:
        """One forward + greedy pick (prefill on the first call)."""
        if self.runtime is not None:
            _attach(self.model, self.runtime)
        started = time.perf_counter()
        if self.runtime is not None:
            self.runtime.begin_step()
        logits = self.model(self.ids, self.state)
        if self.runtime is not None:
            self.runtime.end_step()
        self.tokens.append(int(logits[-1].argmax()))  # syncs the device
        if timed:
            self.times.append(time.perf_counter() - started)
        self.ids = torch.tensor([self.tokens[-1]], device=self.device)


def _attach(model, runtime: OffloadRuntime) -> None:
    """Route every MoE block of ``model`` through ``runtime``."""
    for block in model.moe_blocks():
        block.experts.runtime = runtime
    model.moe_runtime = runtime


def strategy_runtime(base: OffloadRuntime, fraction: float, mode: str, ratio: float,
                     eta: float) -> OffloadRuntime:
    """A runtime over ``base``'s banks with its own cache of ``fraction`` of all experts
    (preloaded with the uniform hot set) and its own split."""
    banks, cache = base.banks, base.cache
    slots = max(1, round(fraction * banks.num_ids))
    scores = make_scores(cache.scores.name, banks.num_ids, cache.device)
    own = ExpertCache(banks, slots, cache.device, cache.dtype, scores)
    own.preload(torch.from_numpy(uniform_hot_set(banks.num_layers, banks.num_experts, slots)))
    return OffloadRuntime(banks, own, MissSplit(mode, ratio=ratio, eta=eta), mode)


def hit_rate(runtime: OffloadRuntime) -> float:
    """Hits / routed experts of ``runtime`` since it was made."""
    s = runtime.stats()
    hits, misses = sum(l.hits for l in s.layers), sum(l.misses for l in s.layers)
    return hits / (hits + misses) if hits + misses else 0.0


def run(args: argparse.Namespace) -> list[dict]:
    """Time every configuration; returns one row per (fraction, strategy) plus the resident row."""
    path = Path(args.model) if args.model else small_model()
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    ratio = args.ratio if args.ratio is not None else profiled_ratio(path, args)
    print(f"model {path} ({args.dtype}, {args.device}); split ratio B_P/B_H = {ratio:.3f}; "
          f"{args.steps} timed steps after {args.warmup}, lanes interleaved step by step")
    resident = load_model(path, dtype=dtype, device=args.device)
    model = load_model(path, dtype=dtype, device=args.device,
                       moe=MoeConfig(backend="hybrid", cache="1"))
    base = model.moe_runtime
    rows, base_times = [], []
    for fraction in args.fractions:
        lanes = [Lane("resident", resident)] + [
            Lane(name, model, strategy_runtime(base, fraction, mode, ratio, args.eta))
            for name, mode in STRATEGIES]
        for i in range(args.warmup + args.steps):
            shift = i % len(lanes)
            for lane in lanes[shift:] + lanes[:shift]:  # rotate who runs first
                lane.step(timed=i >= args.warmup)
        expected = lanes[0].tokens
        base_times.extend(lanes[0].times)
        for lane in lanes[1:]:
            rows.append(dict(fraction=fraction, strategy=lane.name,
                             ms=statistics.median(lane.times) * 1e3,
                             hit_rate=hit_rate(lane.runtime), same=lane.tokens == expected,
                             split_ratio=lane.runtime.split.fill_fraction))
        del lanes
    ms = statistics.median(base_times) * 1e3
    rows.insert(0, dict(fraction=1.0, strategy="resident", ms=ms, hit_rate=1.0, same=True))
    for row in rows:
        row["ratio_resident"] = row["ms"] / ms
    print_table(rows)
    return rows


def profiled_ratio(path: Path, args: argparse.Namespace) -> float:
    """B_P / B_H of the stored profile of this model and device, else 0.5."""
    from freetoken.offload.loading import planned_bank_dtype
    from freetoken.offload.profile import default_profile_path, load_profile

    try:
        bank = planned_bank_dtype(path, args.dtype)
        profile = load_profile(default_profile_path(path, args.device.split(":")[0], bank))
    except (FileNotFoundError, ValueError):
        profile = None
    return profile.ratio if profile is not None else 0.5


def print_table(rows: list[dict]) -> None:
    """Printed table: ms/step, x resident, hit rate, identical tokens, hybrid / best fixed."""
    print(f"{'cache':>6} {'strategy':>9} {'ms/step':>8} {'x res':>6} {'hit':>6} {'same':>5} "
          f"{'q/m':>6} {'hyb/best':>8}")
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
    parser.add_argument("--steps", type=int, default=48, help="timed decode steps")
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
