"""Replay recorded MoE routing through expert-cache policies at equal capacity (issue 3, bench 3).

For every ``*.npz`` trace in ``--routing`` (format: that folder's README.md) and every pool
fraction, prints the decode hit rate of each policy over one shared pool of
``S = round(fraction * layers * experts)`` slots (at least 1).

Steps. Contiguous prefill rows (``token_phase == 0``; split where ``seq_id`` changes) run as one
step: per layer, the union of their routed ids. Each decode row is one step, except that rows
sharing a ``step_id`` (batched decode) run together. Traces with no decode rows (``meta.phase``
"prefill", no ``token_phase``) are replayed row by row as if decoded (mode ``rows`` in the
table). ``-1`` entries are skipped.

Scoring. Prefill steps warm the cache but are not scored; the first ``--warmup-frac`` of the
decode steps are a warm-up slice, replayed but not scored, for every policy alike. The hit rate
is hits / accesses over the remaining decode steps, an access being one distinct routed
(layer, expert) of one step.

Policies (freetoken.offload.policies): LRU and LFU-decay fill every miss; the hot sets never
evict and let misses bypass the cache: ``st-unif`` (S/L random experts per layer, fixed at load,
``--seed``), ``st-warm`` (top-S ids of the warm-up slice, fixed at load), ``pf-hot`` (starts as
st-unif, re-chosen from the prefill rows' counts at the first decode step; equals st-unif on
decode-only traces), ``oracle`` (top-S ids over the whole trace, never evicting); ``MIN`` is
Belady's optimum with demand fill (bounds LRU/LFU), ``MIN+byp`` Belady when misses may
bypass, preloaded like the hot sets (exact for one id per group, a greedy near-bound here). ``LFU/LRU`` and ``orc/LRU`` are ratios of hit rates.

Run: ``python -m evals.replay_routing [--routing DIR] [--fractions 0.1 0.25 0.5]`` (~1-2 min).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from freetoken.paths import shared_dir

from freetoken.offload import (
    LRU,
    Belady,
    BeladyBypass,
    DecayedLFU,
    FrequencyOracle,
    PrefillHotSet,
    StaticHotSet,
    access_counts,
    build_steps,
    replay,
    schedule,
    top_ids,
    uniform_hot_set,
)

DEFAULT_ROUTING = shared_dir() / "routing"
COLUMNS = ["LRU", "LFU-d", "LFU/LRU", "st-unif", "st-warm", "pf-hot", "oracle", "orc/LRU", "MIN", "MIN+byp"]


def load_trace(path: Path) -> tuple[np.ndarray, dict, list[np.ndarray], list[bool], str]:
    """Read one trace: ``(topk_ids [T, L, k], meta, step_rows, step_is_decode, mode)``.

    Raises ValueError for a file without ``topk_ids`` / ``meta`` or with a bad ``topk_ids`` rank.
    """
    with np.load(path) as z:
        if "topk_ids" not in z or "meta" not in z:
            raise ValueError(f"{path}: a routing trace needs 'topk_ids' and 'meta'")
        ids = z["topk_ids"]
        meta = json.loads(str(z["meta"]))
        extra = {k: z[k] for k in ("token_phase", "seq_id", "step_id") if k in z}
    if ids.ndim != 3:
        raise ValueError(f"{path}: topk_ids must be [tokens, layers, k], got {ids.shape}")
    n = ids.shape[0]
    if "token_phase" in extra:
        is_decode, mode = extra["token_phase"].astype(bool), "pf+dec"
    elif meta.get("phase") == "prefill":
        is_decode, mode = np.ones(n, bool), "rows"
    else:
        is_decode, mode = np.ones(n, bool), "dec"
    seq = extra.get("seq_id", np.zeros(n, np.int64))
    step = extra.get("step_id", np.arange(n))
    # a new step starts where the phase or sequence changes, and at every decode row whose
    # step_id differs from the previous row's; prefill runs stay whole
    new = np.ones(n, bool)
    new[1:] = (is_decode[1:] != is_decode[:-1]) | (seq[1:] != seq[:-1])
    new[1:] |= is_decode[1:] & (step[1:] != step[:-1])
    starts = np.flatnonzero(new)
    step_rows = np.split(np.arange(n), starts[1:])
    return ids, meta, step_rows, [bool(is_decode[r[0]]) for r in step_rows], mode


def run_trace(path: Path, fractions: list[float], warmup_frac: float, seed: int) -> list[list[str]]:
    """One table row per fraction for the trace at ``path`` (cells as strings)."""
    ids, meta, step_rows, decode, mode = load_trace(path)
    num_layers, num_experts = ids.shape[1], int(meta["num_experts"])
    pool = num_layers * num_experts
    decode_steps = [i for i, d in enumerate(decode) if d]
    warm = set(decode_steps[: math.ceil(warmup_frac * len(decode_steps))])
    scored = [d and i not in warm for i, d in enumerate(decode)]
    rows = []
    for frac in fractions:
        slots = max(1, round(frac * pool))
        steps = build_steps(ids, num_experts, slots, step_rows, decode, scored)
        groups = schedule(steps)
        warm_groups = [g for i in sorted(warm) for g in steps[i].groups]
        unif = uniform_hot_set(num_layers, num_experts, slots, seed)
        policies = {
            "LRU": LRU(slots, pool),
            "LFU-d": DecayedLFU(slots, pool),
            "st-unif": StaticHotSet(slots, pool, unif),
            "st-warm": StaticHotSet(slots, pool, top_ids(access_counts(warm_groups, pool), slots)),
            "pf-hot": PrefillHotSet(slots, pool, unif),
            "oracle": FrequencyOracle(slots, pool, groups),
            "MIN": Belady(slots, pool, groups),
            "MIN+byp": BeladyBypass(slots, pool, groups),
        }
        counts = {name: replay(p, steps) for name, p in policies.items()}
        rate = {name: c.hit_rate for name, c in counts.items()}
        accesses = counts["LRU"].accesses
        rate["LFU/LRU"] = rate["LFU-d"] / rate["LRU"] if rate["LRU"] else float("nan")
        rate["orc/LRU"] = rate["oracle"] / rate["LRU"] if rate["LRU"] else float("nan")
        if not warm:
            rate["st-warm"] = float("nan")
        n_scored = sum(scored)
        rows.append([path.stem, mode, f"{num_layers}x{num_experts}", f"{slots} ({frac:g})",
                     f"{n_scored}/{accesses}"] + [_fmt(rate[c], c) for c in COLUMNS])
    return rows


def _fmt(x: float, column: str) -> str:
    if math.isnan(x):
        return "-"
    return f"{x:.2f}x" if "/" in column else f"{x:.3f}"


def main() -> None:
    """Parse arguments, replay every trace, print one table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--routing", type=Path, default=DEFAULT_ROUTING, help="folder of *.npz traces")
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.1, 0.25, 0.5],
                    help="pool sizes as fractions of layers x experts")
    ap.add_argument("--warmup-frac", type=float, default=0.25,
                    help="leading share of decode steps replayed unscored (st-warm's slice)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the st-unif / pf-hot load set")
    args = ap.parse_args()
    if not all(0 < f <= 1 for f in args.fractions) or not 0 <= args.warmup_frac < 1:
        ap.error("fractions must lie in (0, 1] and --warmup-frac in [0, 1)")
    if not args.routing.is_dir():
        ap.error(f"no routing folder at {args.routing}; pass --routing DIR (the project's "
                 "shared/routing) or set FREETOKEN_SHARED")
    paths = sorted(args.routing.glob("*.npz"))
    if not paths:
        ap.error(f"no *.npz routing traces in {args.routing}")
    header = ["trace", "mode", "LxE", "S (frac)", "steps/acc"] + COLUMNS
    table = [header] + [r for p in paths for r in run_trace(p, args.fractions, args.warmup_frac, args.seed)]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for i, r in enumerate(table):
        print("  ".join(c.ljust(w) if j < 5 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print(f"\ndecode hit rate; prefill and the first {args.warmup_frac:g} of decode steps warm the "
          "cache unscored; steps/acc = scored steps / scored accesses")


if __name__ == "__main__":
    main()
