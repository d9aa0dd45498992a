"""Prefix-reuse benchmark (issue 4): real agent conversations replayed through the engine under
recurrent-state checkpoint policies and capacities.

Every trace of ../shared/traces (one conversation, or one Claude Code session with its main
thread, Task sub-agents and side calls interleaved in recorded order; see ``prefix_traces``) is
served by a fresh ``freetoken.engine.engine.Engine``, one request at a time in recorded order,
each to completion, after the harness's edits (``harness_adapters``). The scheduler, radix tree,
checkpoint store and retention are the real ones; the model is ``prefix_null_model.ScriptedLM``,
which emits the recorded reply (as the next request of a tool loop re-renders it) so the
generation-end checkpoint is exercised, and checks every restored state (a wrong checkpoint
changes its output, which the replay rejects).

Per request: reused = the engine's ``cached_tokens``; recomputed = prompt - reused; minimum =
prompt - the longest common prefix with anything served before on that engine (earlier prompts and
their generated tokens), capped at prompt - 1 (computed here, independently of the engine).
Policies (paper §3.1; checkpoint-policy-sim.md P0-P4): ``none`` (prefix reuse off; the engine with
``AnchorPolicy.none()`` still checkpoints a finished request's live state, i.e. tail reuse),
``tail-only``
(generation-end checkpoints), ``interval`` (every 2048 prompt tokens + generation end),
``turn-start`` (turn starts + generation start), ``anchors`` (every anchor kind, the store's
value-aware retention). Capacities: 8 and 32 device checkpoint slots without a host tier, and
``default``: the default device slots plus as many host checkpoints as the default host budget
(``DEFAULT_CHECKPOINT_HOST_BYTES``) holds for the real Qwen3-Next-80B-A3B GDN state.

TTFT: with ``--model null`` a model, recomputed tokens x per-token prefill seconds + a fixed
per-request overhead, both measured in the same run on the tiny hybrid checkpoint; with
``--model tiny`` (the real tiny checkpoint runs every forward, outputs still scripted) the wall
time from ``add_request`` to the first output chunk.

Run: ``python -m evals.bench_prefix [--groups w3-claude-code] [--json out.json]`` (every group,
policy and capacity: ~600 CPU-seconds, mostly the engine's decode steps over the scripted replies;
two forked workers by default).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from evals.prefix_null_model import NullConfig, ReplyScript, ScriptedLM
from evals.prefix_traces import GROUPS, Group, RenderedCall, Renderer, group_traces
from freetoken.chat.template import ChatTemplate
from freetoken.core import EngineInfo, GenerationRequest, SamplingParams
from freetoken.engine.engine import Engine
from freetoken.models.registry import load_model
from freetoken.models.tiny import default_model_path
from freetoken.paths import shared_dir
from freetoken.prefix.anchors import AnchorPolicy
from freetoken.prefix.build import CacheConfig
from freetoken.prefix.checkpoints import RecurrentLayout
from freetoken.prefix.manager import DEFAULT_CHECKPOINT_HOST_BYTES, DEFAULT_CHECKPOINT_SLOTS
from freetoken.tokenizer.tokenizer import Tokenizer

GOAL = 1.05
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # replays run in forked processes


@dataclass(frozen=True)
class Policy:
    """A checkpoint policy: anchor kinds, fixed grid (tokens, 0 off), prefix reuse on/off."""

    name: str
    anchors: AnchorPolicy
    interval: int = 0
    reuse: bool = True


POLICIES = (
    Policy("none", AnchorPolicy.none(), reuse=False),
    Policy("tail-only", AnchorPolicy.parse("generation_end")),
    Policy("interval", AnchorPolicy.parse("generation_end"), interval=2048),
    Policy("turn-start", AnchorPolicy.parse("turn_start,generation_start")),
    Policy("anchors", AnchorPolicy.all()),
)


@dataclass(frozen=True)
class Capacity:
    """Checkpoint capacity: device slots + host-tier checkpoints (bytes = count x checkpoint)."""

    name: str
    device_slots: int
    host_checkpoints: int = 0


def qwen3_next_80b_layout() -> RecurrentLayout:
    """Recurrent state of Qwen3-Next-80B-A3B (model-architectures.md §1.6): 36 Gated DeltaNet
    layers (48 layers, full attention every 4th), each a conv state ``[8192, 3]`` bf16
    (conv_dim = 2*16*128 + 32*128, kernel 4) and a delta-rule state ``[32, 128, 128]`` fp32."""
    per_layer = (((2 * 16 * 128 + 32 * 128, 3), torch.bfloat16), ((32, 128, 128), torch.float32))
    return RecurrentLayout(per_layer * 36)


def capacities() -> tuple[Capacity, ...]:
    """8, 32 and the default budget (device slots + host checkpoints of the real model)."""
    host = DEFAULT_CHECKPOINT_HOST_BYTES // qwen3_next_80b_layout().bytes_per_checkpoint()
    return (Capacity("8", 8), Capacity("32", 32),
            Capacity("default", DEFAULT_CHECKPOINT_SLOTS, host))


# ---------------------------------------------------------------------------------- replay
@dataclass
class Bench:
    """Scripted model, its script, tokenizer and engine step budget, shared by all replays."""

    model: ScriptedLM
    script: ReplyScript
    tokenizer: Tokenizer
    kind: str
    chunk: int = 8192

    @property
    def checkpoint_bytes(self) -> int:
        """Bytes of one recurrent-state checkpoint of the served model."""
        return self.model.recurrent_layout().bytes_per_checkpoint()


def make_bench(kind: str, tokenizer: Tokenizer, chunk: int = 8192) -> Bench:
    """The null stand-in (``kind="null"``) or the scripted tiny checkpoint (``"tiny"``).

    Raises:
        ValueError: unknown kind, or the tokenizer has no ``<|im_end|>``.
    """
    eos = tokenizer.token_to_id("<|im_end|>")
    if eos is None:
        raise ValueError("tokenizer has no <|im_end|> token")
    script = ReplyScript()
    if kind == "null":
        model = ScriptedLM(script, NullConfig(tokenizer.vocab_size, eos))
    elif kind == "tiny":
        inner = load_model(default_model_path())
        model = ScriptedLM(script, NullConfig(inner.config.vocab_size, eos), inner=inner)
    else:
        raise ValueError(f"unknown model {kind!r}: use null or tiny")
    return Bench(model.eval(), script, tokenizer, kind, chunk)


@dataclass(frozen=True)
class TraceCase:
    """One trace ready to replay: rendered calls, per-request minimum, unique served tokens."""

    name: str
    calls: tuple[RenderedCall, ...]
    minimum: tuple[int, ...]
    unique_tokens: int


def minimum_recompute(calls) -> tuple[tuple[int, ...], int]:
    """Per request the fewest tokens any policy must recompute, and an upper bound of the
    distinct tokens served (each prompt + reply minus the prompt's longest served prefix; KV pool
    sizing).

    minimum = prompt - min(LCP(prompt, any earlier prompt + its reply), prompt - 1).
    """
    served: list[np.ndarray] = []
    out, unique = [], 0
    for call in calls:
        p = np.asarray(call.prompt_ids, dtype=np.int64)
        best = 0
        for s in served:
            n = min(len(p), len(s))
            if n <= best:
                continue
            diff = np.flatnonzero(p[:n] != s[:n])
            best = max(best, int(diff[0]) if diff.size else n)
        out.append(len(p) - min(best, len(p) - 1))
        seq = np.concatenate([p, np.asarray(call.reply_ids, dtype=np.int64)])
        unique += len(seq) - best
        served.append(seq)
    return tuple(out), unique


def make_case(name: str, calls) -> TraceCase:
    """A :class:`TraceCase` with its minimum computed."""
    minimum, unique = minimum_recompute(calls)
    return TraceCase(name, tuple(calls), minimum, unique)


class ReplayError(RuntimeError):
    """The engine's output differed from the script (a wrong reuse decision) or it failed."""


@dataclass(frozen=True)
class RequestStat:
    """One replayed request: prompt tokens, reused tokens, wall TTFT (s)."""

    prompt: int
    cached: int
    ttft_s: float


def replay(bench: Bench, case: TraceCase, policy: Policy, cap: Capacity
           ) -> tuple[list[RequestStat], int]:
    """Serve ``case`` on a fresh engine under ``policy`` / ``cap``; returns the per-request
    stats and how many checkpoints the full store evicted.

    The KV pool holds every served token (no KV eviction): only the checkpoint policy and the
    checkpoint capacity decide what is reused.

    Raises:
        ReplayError: a request did not end with exactly its scripted reply.
    """
    max_len = max(len(c.prompt_ids) + len(c.reply_ids) for c in case.calls) + 16
    cache = CacheConfig(
        checkpoint_slots=cap.device_slots,
        checkpoint_host_bytes=cap.host_checkpoints * bench.checkpoint_bytes,
        anchors=policy.anchors, prefix_reuse=policy.reuse, checkpoint_interval=policy.interval,
        max_running_requests=math.ceil(case.unique_tokens / max_len) + 1)
    tok = bench.tokenizer
    info = EngineInfo(f"scripted-{bench.kind}", "qwen3_next", max_len, tok.vocab_size,
                      tok.eos_token_ids)
    engine = Engine(bench.model, tok, info, max_num_batched_tokens=bench.chunk, cache=cache)
    kv_evicted = _count_kv_evictions(engine)
    stats = []
    for key, call in enumerate(case.calls):
        bench.script.set(call.prompt_ids, call.reply_ids)
        chunks, first = [], []

        def sink(chunk, chunks=chunks, first=first):
            if chunk.token_ids and not first:
                first.append(time.perf_counter())
            chunks.append(chunk)

        request = GenerationRequest(f"{case.name}-{key}", call.prompt_ids,
                                    SamplingParams(max_tokens=len(call.reply_ids), temperature=0.0))
        start = time.perf_counter()
        engine.add_request(key, request, sink)
        while engine.step():
            pass
        out = tuple(t for c in chunks for t in c.token_ids)
        last = chunks[-1]
        if last.finish_reason != "stop" or out != call.reply_ids:
            raise ReplayError(
                f"{case.name} request {key} ({call.thread}), policy {policy.name}, capacity "
                f"{cap.name}: finish {last.finish_reason} {last.error or ''}; emitted {len(out)} "
                f"tokens, {sum(a == b for a, b in zip(out, call.reply_ids))} matching the "
                f"{len(call.reply_ids)}-token script (a restored state that does not match its "
                "prefix changes the output)")
        stats.append(RequestStat(len(call.prompt_ids), last.cached_tokens,
                                 (first[0] if first else time.perf_counter()) - start))
    if kv_evicted:
        raise ReplayError(f"{case.name}: the KV pool evicted {len(kv_evicted)} radix nodes; the "
                          "benchmark sizes it to hold every served token")
    store = engine.prefix.store if engine.prefix is not None else None
    return stats, (store.stats()["evictions"] if store is not None else 0)


def _count_kv_evictions(engine: Engine) -> list:
    """A list that grows by one per radix node the engine's KV pool evicts (wraps the tree's
    ``on_evict`` hook, which still runs)."""
    evicted: list = []
    if engine.prefix is None:
        return evicted
    tree, hook = engine.prefix.tree, engine.prefix.tree.on_evict

    def on_evict(node) -> None:
        evicted.append(node.depth)
        if hook is not None:
            hook(node)

    tree.on_evict = on_evict
    return evicted


def replay_capacities(bench: Bench, case: TraceCase, policy: Policy, caps
                      ) -> dict[str, list[RequestStat]]:
    """``{capacity: stats}`` of one policy, capacities in increasing size. A run in which the
    store never evicted is exactly what every larger capacity gives (without evictions the live
    checkpoints do not depend on capacity), so it is reused for them."""
    out: dict[str, list[RequestStat]] = {}
    same: list[RequestStat] | None = None
    for cap in caps:
        if same is None:
            stats, evictions = replay(bench, case, policy, cap)
            out[cap.name] = stats
            same = stats if evictions == 0 else None
        else:
            out[cap.name] = same
    return out


# ---------------------------------------------------------------------------------- TTFT model
@dataclass(frozen=True)
class TTFTModel:
    """TTFT = recomputed tokens x ``per_token_s`` + ``overhead_s`` (null model), or measured."""

    per_token_s: float
    overhead_s: float
    measured: bool = False

    def ttft(self, recomputed: int, stat: RequestStat) -> float:
        """TTFT (s) of one request."""
        return stat.ttft_s if self.measured else recomputed * self.per_token_s + self.overhead_s


def calibrate_prefill(prompt: tuple[int, ...], repeats: int = 3) -> TTFTModel:
    """Per-token prefill seconds and per-request overhead of the tiny hybrid checkpoint through
    the engine: TTFT of a cold ``len(prompt)``-token prompt and of the same prompt again (one
    recomputed token; default anchors reuse the rest), medians over ``repeats``."""
    path = default_model_path()
    model, tok = load_model(path), Tokenizer.from_pretrained(path)
    info = EngineInfo(str(path), "qwen3_next", len(prompt) + 8, tok.vocab_size, tok.eos_token_ids)
    sampling = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)

    def ttft(engine: Engine, key: int) -> float:
        got: list[float] = []
        start = time.perf_counter()
        engine.add_request(key, GenerationRequest(str(key), prompt, sampling),
                           lambda c: got.append(time.perf_counter()) if c.token_ids else None)
        while engine.step():
            pass
        return got[0] - start

    cold, warm = [], []
    for i in range(repeats + 1):
        engine = Engine(model, tok, info, max_num_batched_tokens=len(prompt) + 8)
        c, w = ttft(engine, 0), ttft(engine, 1)
        if i:  # the first round warms up torch
            cold.append(c)
            warm.append(w)
    per_token = max(statistics.median(cold) - statistics.median(warm), 0.0) / (len(prompt) - 1)
    return TTFTModel(per_token, max(statistics.median(warm) - per_token, 0.0))


# ---------------------------------------------------------------------------------- summary
@dataclass
class Row:
    """One table row: a policy at a capacity over one group."""

    group: str
    policy: str
    capacity: str
    recomputed: int
    minimum: int
    ratio: float
    worst_trace: str
    worst_ratio: float
    ttft_mean: float = 1.0
    ttft_max: float = 1.0
    traces: dict = field(default_factory=dict)


def summarize(group: str, cases: list[TraceCase], runs: dict, ttft: TTFTModel) -> list[Row]:
    """Rows of one group; ``runs[(policy, capacity)][trace] = list[RequestStat]``."""
    rows = []
    for (pname, cname), per_trace in runs.items():
        anchors = runs.get(("anchors", cname), per_trace)
        rec_total = min_total = 0
        traces, ratios = {}, []
        for case in cases:
            stats = per_trace[case.name]
            rec = [s.prompt - s.cached for s in stats]
            rec_total += sum(rec)
            min_total += sum(case.minimum)
            traces[case.name] = {"recomputed": sum(rec), "minimum": sum(case.minimum),
                                 "ratio": sum(rec) / sum(case.minimum), "per_request": rec}
            for s, r, a in zip(stats, rec, anchors[case.name]):
                ratios.append(ttft.ttft(r, s) / ttft.ttft(a.prompt - a.cached, a))
        worst = max(traces, key=lambda t: traces[t]["ratio"])
        rows.append(Row(group, pname, cname, rec_total, min_total, rec_total / min_total, worst,
                        traces[worst]["ratio"], statistics.fmean(ratios), max(ratios), traces))
    return rows


def print_group(title: str, cases: list[TraceCase], rows: list[Row]) -> None:
    """The group's table: recomputed tokens / minimum and TTFT ratio vs anchors."""
    n_calls = sum(len(c.calls) for c in cases)
    prompt = sum(len(x.prompt_ids) for c in cases for x in c.calls)
    minimum = sum(sum(c.minimum) for c in cases)
    print(f"\n{title}: {len(cases)} traces, {n_calls} calls, {prompt:,} prompt tokens, "
          f"minimum {minimum:,} recomputed")
    head = ("policy", "capacity", "recomputed", "x min", "worst trace x min", "TTFT/anchors mean",
            "max")
    table = [head] + [(r.policy, r.capacity, f"{r.recomputed:,}", f"{r.ratio:.3f}",
                       f"{r.worst_ratio:.3f}", f"{r.ttft_mean:.2f}", f"{r.ttft_max:.2f}")
                      for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for i, row in enumerate(table):
        print("  " + "  ".join(c.ljust(w) if j < 2 else c.rjust(w)
                               for j, (c, w) in enumerate(zip(row, widths))))
        if i == 0:
            print("  " + "  ".join("-" * w for w in widths))


# ---------------------------------------------------------------------------------- driver
def load_cases(group: Group, traces_dir: Path, renderer: Renderer, max_calls: int
               ) -> list[TraceCase]:
    """Render the group's traces (first ``max_calls`` calls of each; 0: all)."""
    cases = []
    for trace in group_traces(group, traces_dir):
        calls = trace.calls[:max_calls] if max_calls else trace.calls
        cases.append(make_case(trace.name, [renderer.render(c, group.variant) for c in calls]))
    return cases


_WORK: dict = {}  # what forked workers replay (set before the pool starts)


def _job(task: tuple[str, int, str]) -> tuple[str, int, str, dict]:
    group, index, pname = task
    torch.set_num_threads(1)
    policy = next(p for p in POLICIES if p.name == pname)
    case = _WORK["cases"][group][index]
    return group, index, pname, replay_capacities(_WORK["bench"], case, policy, _WORK["caps"])


def run_all(bench: Bench, cases: dict[str, list[TraceCase]], policies, caps, jobs: int = 1
            ) -> dict[str, dict]:
    """``{group: {(policy, capacity): {trace: [RequestStat]}}}``, replays spread over ``jobs``
    forked processes (largest traces first)."""
    tasks = [(g, i, p.name) for g, cs in cases.items() for i in range(len(cs)) for p in policies]
    cost = {(g, i): sum(len(x.reply_ids) + len(x.prompt_ids) // 256 for x in c.calls)
            for g, cs in cases.items() for i, c in enumerate(cs)}
    tasks.sort(key=lambda t: -cost[t[:2]])
    _WORK.update(bench=bench, cases=cases, caps=tuple(caps))
    if jobs > 1:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            done = list(pool.imap_unordered(_job, tasks))
    else:
        done = [_job(t) for t in tasks]
    out: dict[str, dict] = {g: {(p.name, c.name): {} for p in policies for c in caps}
                            for g in cases}
    for group, index, pname, per_cap in done:
        for cname, stats in per_cap.items():
            out[group][(pname, cname)][cases[group][index].name] = stats
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The benchmark's options (``argv`` None: ``sys.argv``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, default=shared_dir() / "traces",
                    help="the shared traces folder (default <shared>/traces)")
    ap.add_argument("--model", choices=("null", "tiny"), default="null",
                    help="null: scripted stand-in, modeled TTFT; tiny: the tiny hybrid checkpoint "
                         "runs every forward, wall-clock TTFT (use --max-calls)")
    ap.add_argument("--max-calls", type=int, default=0, help="first N calls of each trace (0: all)")
    ap.add_argument("--groups", nargs="+", default=[g.key for g in GROUPS],
                    choices=[g.key for g in GROUPS])
    ap.add_argument("--policies", nargs="+", default=[p.name for p in POLICIES],
                    choices=[p.name for p in POLICIES])
    ap.add_argument("--chunk", type=int, default=8192, help="engine token budget per step")
    ap.add_argument("--jobs", type=int, default=2, help="parallel replay processes (null model)")
    ap.add_argument("--json", type=Path, default=None, help="write every row (and per-trace "
                    "numbers) here")
    args = ap.parse_args(argv)
    if "anchors" not in args.policies:
        args.policies.append("anchors")  # the TTFT baseline
    if args.max_calls < 0:
        ap.error("--max-calls must be >= 0")
    if args.jobs < 1 or args.chunk < 1:
        ap.error("--jobs and --chunk must be >= 1")
    return args


def run(args: argparse.Namespace) -> list[Row]:
    """Replay the selected groups and print the tables; returns every row."""
    if not args.traces.is_dir():
        raise SystemExit(f"bench_prefix: no traces folder at {args.traces}; pass --traces DIR "
                         "(the project's shared/traces) or set FREETOKEN_SHARED")
    t0 = time.perf_counter()
    tok = Tokenizer.from_pretrained(default_model_path())
    renderer = Renderer(tok, ChatTemplate.for_model(tok.chat_template, "qwen3_next"))
    bench = make_bench(args.model, tok, args.chunk)
    caps = capacities()
    policies = [p for p in POLICIES if p.name in args.policies]
    groups = [g for g in GROUPS if g.key in args.groups]
    cases = {g.key: load_cases(g, args.traces, renderer, args.max_calls) for g in groups}
    jobs = 1 if args.model == "tiny" else args.jobs  # wall-clock TTFT: one replay at a time
    runs = run_all(bench, cases, policies, caps, jobs)
    ttft = TTFTModel(0.0, 0.0, measured=True)
    if args.model == "null":  # after the forked replays (no torch threads started before)
        first = next(x.prompt_ids for cs in cases.values() for c in cs for x in c.calls)
        ttft = calibrate_prefill(tuple((first * 512)[:512]))
    _print_header(args, bench, caps, ttft, renderer.unaligned)
    rows: list[Row] = []
    for g in groups:
        group_rows = summarize(g.key, cases[g.key], runs[g.key], ttft)
        print_group(g.title, cases[g.key], group_rows)
        rows += group_rows
    _print_goal(rows)
    print(f"\ntotal {time.perf_counter() - t0:.1f} s")
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1), encoding="utf-8")
    return rows


def _print_header(args, bench: Bench, caps, ttft: TTFTModel, unaligned: int) -> None:
    real = qwen3_next_80b_layout().bytes_per_checkpoint()
    default = caps[-1]
    print(f"bench_prefix: model {args.model}, traces {args.traces}, engine step budget "
          f"{args.chunk} tokens, KV pool holds every served token")
    print(f"capacity 'default' = {default.device_slots} device slots + "
          f"{DEFAULT_CHECKPOINT_HOST_BYTES / 2**30:g} GiB host / {real / 2**20:.1f} MiB per "
          f"Qwen3-Next-80B-A3B checkpoint = {default.device_slots} + {default.host_checkpoints} = "
          f"{default.device_slots + default.host_checkpoints} checkpoints (stand-in checkpoint "
          f"{bench.checkpoint_bytes} B, host tier "
          f"{default.host_checkpoints * bench.checkpoint_bytes} B)")
    if ttft.measured:
        print("TTFT: wall time from add_request to the first output chunk (tiny checkpoint)")
    else:
        print(f"TTFT model: recomputed tokens x {ttft.per_token_s * 1e6:.1f} us + "
              f"{ttft.overhead_s * 1e3:.2f} ms, measured now on the tiny hybrid checkpoint "
              "(512-token cold prefill vs the same prompt with one recomputed token)")
    print(f"{unaligned} scripted replies re-tokenise differently after the prompt (their first "
          "token merges with the generation prompt's newline): generation-end checkpoints of "
          "those replies are off the next prompt's path")


def _print_goal(rows: list[Row]) -> None:
    anchors = [r for r in rows if r.policy == "anchors" and r.capacity == "default"]
    if not anchors:
        return
    worst = max(((t, v["ratio"], r.group) for r in anchors for t, v in r.traces.items()),
                key=lambda x: x[1])
    failing = [f"{g}/{t} {v:.3f}" for r in anchors for t, d in r.traces.items()
               for g, v in [(r.group, d["ratio"])] if v > GOAL]
    verdict = "HOLDS" if not failing else "FAILS on " + ", ".join(failing)
    print(f"\ngoal (anchors, default budget, <= {GOAL} x minimum on every trace): {verdict}; "
          f"worst trace {worst[2]}/{worst[0]} {worst[1]:.3f}")


def main(argv: list[str] | None = None) -> None:
    """Command-line entry: ``python -m evals.bench_prefix``."""
    try:
        run(parse_args(argv))
    except ReplayError as exc:
        sys.exit(f"bench_prefix: {exc}")


if __name__ == "__main__":
    main()
