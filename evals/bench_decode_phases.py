"""Where one CPU decode step spends its time: each op's bytes read, ms and GB/s, against the
machine's read bandwidth measured in the same run.

The checkpoint is loaded as ``freetoken serve --model DIR`` loads it here (the serve parser's
defaults plus ``--serve-args``); ``B`` sequences get a paged KV pool holding ``C`` positions each
(random K/V: attention's cost does not depend on the values) and random recurrent states. The
step then runs op by op on real hidden states (each mixer, each MoE block, the lm_head: the ops
the C++ decode stack chains, called one at a time), and whole through the model's
``forward_batch``. Bytes are what each op must read at least: its weights (the experts the
routing picked, each once per step), K and V of every position, recurrent states read and
written. The bound of a case is its bytes at the measured read bandwidth.

    python -m evals.bench_decode_phases --model ~/.cache/freetoken/models/small-qwen3_next \\
        --cases 1x16,1x2048,1x16384,8x512
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from freetoken.models.decode_stack import decode_layer_specs
from freetoken.models.paged import PagedDecodeBatch, SlotTable
from freetoken.ops.attention_decode import paged_decode_attention
from freetoken.ops.cpu_moe import cpu
from freetoken.ops.decode_stack import AttentionLayer, GdnLayer
from freetoken.ops.gdn_decode import gdn_decode
from freetoken.ops.linear import kernel_linear
from freetoken.ops.moe_block import moe_block_decode
from freetoken.prefix.kv_pool import KVPagePool

PAGE = 16
READ_BYTES = 512 * 2**20  # the bandwidth probe: far above any cache


@dataclass
class Phase:
    """One kind of op over a step: ``calls`` per step, median ms summed over the calls, bytes."""

    name: str
    calls: int = 0
    ms: float = 0.0
    bytes: int = 0

    @property
    def gbps(self) -> float:
        return self.bytes / self.ms / 1e6 if self.ms > 0 else 0.0


@dataclass
class Case:
    batch: int
    context: int
    step_ms: float
    ops_ms: float
    bytes: int
    bound_ms: float
    distinct_experts: float
    phases: list[Phase] = field(default_factory=list)


def read_gbps(threads: int) -> float:
    """Median GB/s of summing a 512 MiB fp32 tensor on ``threads`` torch threads."""
    x = torch.ones(READ_BYTES // 4)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x.sum()
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            x.sum()
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)
    return READ_BYTES / statistics.median(times) / 1e9


def load(model_dir: Path, serve_args: list[str]):
    """The model as ``freetoken serve --model model_dir *serve_args`` loads it."""
    from freetoken.cli import build_parser
    from freetoken.launch import check_moe_flags, checkpoint_compute_dtype
    from freetoken.models.registry import load_model

    args = build_parser().parse_args(["serve", "--model", str(model_dir), *serve_args])
    if args.dtype == "auto":
        args.dtype = checkpoint_compute_dtype(model_dir)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    return load_model(model_dir, dtype=dtype, device=args.device, moe=check_moe_flags(args))


def _expert_bytes(tensors) -> int:
    """Bytes of one expert of a bank (a tensor or a format's tuple, leading dim E)."""
    if isinstance(tensors, torch.Tensor):
        tensors = (tensors,)
    return sum(t.nbytes // t.shape[0] for t in tensors if isinstance(t, torch.Tensor))


def _nbytes(*tensors) -> int:
    return sum(t.nbytes for t in tensors if isinstance(t, torch.Tensor))


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def new_states(model, batch: int, context: int, extra: int, gen: torch.Generator):
    """``batch`` paged states holding ``context`` positions of random K/V and random recurrent
    states, with slots for ``extra`` more."""
    layout = model.kv_layout()
    per_seq = (context + extra + PAGE - 1) // PAGE
    pool = KVPagePool(layout, num_pages=batch * per_seq + 1, page_size=PAGE)
    states = []
    for _ in range(batch):
        table = SlotTable([s for p in pool.alloc_pages(per_seq) for s in pool.page_slots(p)])
        states.append(model.new_paged_state(pool, table, num_tokens=context))
    if layout is not None:
        for t in (pool.k, pool.v):
            t.copy_(torch.randn(t.shape, generator=gen).to(t.dtype))
    for s in states:
        for layer in s.layers:
            if hasattr(layer, "recurrent"):
                layer.recurrent.copy_(0.05 * torch.randn(layer.recurrent.shape, generator=gen))
                layer.conv.copy_(torch.randn(layer.conv.shape, generator=gen).to(layer.conv.dtype))
    return pool, states


def run_case(model, specs, batch: int, context: int, repeats: int, bandwidth: float,
             gen: torch.Generator) -> Case:
    dtype = model.embed.dtype
    ids = torch.randint(0, min(model.embed.shape[0], 8000), (batch,), generator=gen)
    pool, states = new_states(model, batch, context, repeats + 1, gen)
    attn = [i for i, (mixer, _) in enumerate(specs) if isinstance(mixer, AttentionLayer)]
    cos = sin = kv_slots = kv_offsets = None
    if attn:
        first = [s.layers[attn[0]] for s in states]
        paged = PagedDecodeBatch.of_layer(first, [s.num_tokens for s in states], model.rotary)
        cos, sin, kv_slots, kv_offsets = paged.cos, paged.sin, paged.kv_slots, paged.kv_offsets
    names = []
    for mixer, _ in specs:
        names += ["attention" if isinstance(mixer, AttentionLayer) else "gdn", "moe"]
    names.append("lm_head")
    times: list[list[float]] = [[] for _ in names]
    op_bytes = [0] * len(names)
    distinct: list[int] = []

    def timed(i: int, fn):
        t0 = time.perf_counter()
        out = fn()
        times[i].append(1e3 * (time.perf_counter() - t0))
        return out

    # whole passes over the step, so each op finds its weights as cold as in a real step (one
    # op's weights alone may fit in the last-level cache)
    for _ in range(repeats):
        h = model.embed[ids].clone()
        distinct.clear()
        for layer, (mixer, moe) in enumerate(specs):
            i = 2 * layer
            if isinstance(mixer, AttentionLayer):
                nkv, hd = pool.k.shape[2], pool.k.shape[3]
                out = timed(i, lambda: paged_decode_attention(
                    h, mixer.qkv_w, mixer.o_w, mixer.q_norm, mixer.k_norm, cos, sin,
                    pool.k[mixer.pool_layer], pool.v[mixer.pool_layer], kv_slots, kv_offsets,
                    num_heads=mixer.num_heads, num_kv_heads=mixer.num_kv_heads,
                    gated=mixer.gated, eps=mixer.eps, scale=mixer.scale,
                    input_norm=mixer.input_norm, input_eps=mixer.input_eps,
                    qkv_bias=mixer.qkv_bias, sinks=mixer.sinks, window=mixer.window,
                    o_bias=mixer.o_bias))
                op_bytes[i] = (_nbytes(mixer.qkv_w, mixer.o_w)
                               + 2 * batch * (context + 1) * nkv * hd * pool.k.element_size())
            else:
                assert isinstance(mixer, GdnLayer)
                conv = [s.layers[layer].conv for s in states]
                rec = [s.layers[layer].recurrent for s in states]
                out = timed(i, lambda: gdn_decode(
                    h, mixer.in_w, mixer.conv_w, mixer.dt_bias, mixer.a_log, mixer.norm_w,
                    mixer.out_w, conv, rec, num_k_heads=mixer.num_k_heads,
                    num_v_heads=mixer.num_v_heads, eps=mixer.eps, input_norm=mixer.input_norm,
                    input_eps=mixer.input_eps))
                op_bytes[i] = _nbytes(mixer.in_w, mixer.conv_w, mixer.out_w) + 2 * _nbytes(
                    *rec, *conv)
            h = out.to(dtype)
            out, topk = timed(i + 1, lambda: moe_block_decode(
                h, moe.norm, moe.eps, moe.router, moe.gate_up, moe.down, moe.shared_gate_up,
                moe.shared_down, top_k=moe.top_k, norm_topk_prob=moe.norm_topk_prob,
                score_bias=moe.score_bias, n_group=moe.n_group, topk_group=moe.topk_group,
                routed_scaling=moe.routed_scaling, router_bias=moe.router_bias,
                gate_up_bias=moe.gate_up_bias, down_bias=moe.down_bias,
                swiglu_limit=moe.swiglu_limit, swiglu_alpha=moe.swiglu_alpha,
                expert_format=moe.expert_format, block_size=moe.block_size,
                activations=moe.activations))
            used = int(torch.unique(topk).numel())
            distinct.append(used)
            op_bytes[i + 1] = (_nbytes(moe.router, moe.shared_gate_up, moe.shared_down)
                               + used * (_expert_bytes(moe.gate_up) + _expert_bytes(moe.down)))
            h = out.to(dtype)
        normed = model.norm(h)
        timed(len(names) - 1, lambda: kernel_linear(normed, model.lm_head))
        op_bytes[-1] = model.lm_head.nbytes
    phases = {name: Phase(name) for name in ("attention", "gdn", "moe", "lm_head")}
    for name, t, b in zip(names, times, op_bytes):
        p = phases[name]
        p.calls += 1
        p.ms += statistics.median(t)
        p.bytes += b

    inputs = [ids[i : i + 1] for i in range(batch)]
    with torch.inference_mode():
        model.forward_batch(inputs, states)  # warm-up (builds the decode stack)
        step_ms = _median_ms(lambda: model.forward_batch(inputs, states), repeats)
    total = sum(p.bytes for p in phases.values())
    return Case(batch, context, step_ms, sum(p.ms for p in phases.values()), total,
                total / bandwidth / 1e6, statistics.mean(distinct),
                [p for p in phases.values() if p.calls])


def _cases(text: str) -> list[tuple[int, int]]:
    try:
        out = [tuple(int(v) for v in item.split("x")) for item in text.split(",") if item]
    except ValueError:
        raise argparse.ArgumentTypeError(f"cases look like 1x16,8x512, got {text!r}") from None
    if not out or any(len(c) != 2 or c[0] < 1 or c[0] > 8 or c[1] < 1 for c in out):
        raise argparse.ArgumentTypeError(f"each case is BxC with 1 <= B <= 8, C >= 1: {text!r}")
    return out


def print_case(c: Case) -> None:
    print(f"\nB={c.batch} context={c.context}: step {c.step_ms:.2f} ms (forward_batch), ops "
          f"{c.ops_ms:.2f} ms, {c.bytes / 1e6:.1f} MB -> bound {c.bound_ms:.2f} ms "
          f"(step / bound {c.step_ms / c.bound_ms:.2f}); distinct experts per MoE layer "
          f"{c.distinct_experts:.1f}")
    print(f"  {'op':<10}{'calls':>6}{'ms':>9}{'MB':>9}{'GB/s':>8}{'share':>8}")
    for p in c.phases:
        print(f"  {p.name:<10}{p.calls:>6}{p.ms:>9.2f}{p.bytes / 1e6:>9.1f}{p.gbps:>8.1f}"
              f"{p.ms / c.step_ms:>8.0%}")
    print(f"  {'rest':<10}{'':>6}{c.step_ms - c.ops_ms:>9.2f}{'':>9}{'':>8}"
          f"{(c.step_ms - c.ops_ms) / c.step_ms:>8.0%}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path,
                    default=Path.home() / ".cache/freetoken/models/small-qwen3_next")
    ap.add_argument("--cases", type=_cases, default=_cases("1x16,1x2048,1x16384,8x512"),
                    help="comma list of BxC: B sequences (1-8) of C cached positions each")
    ap.add_argument("--repeats", type=int, default=15, help="timed calls per op (median)")
    ap.add_argument("--serve-args", default="", help="extra freetoken serve flags")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    model = load(args.model, args.serve_args.split())
    specs = decode_layer_specs(model)
    if specs is None:
        print("this model's decode step does not run on the C++ decode ops (offloaded experts or "
              "weights off the CPU): nothing to break down", file=sys.stderr)
        return 2
    threads = cpu.num_threads()
    bandwidth = read_gbps(threads)
    print(f"{args.model.name} ({model.embed.dtype}), {threads} kernel threads; read bandwidth "
          f"{bandwidth:.1f} GB/s (sum of 512 MiB fp32, {threads} torch threads)")
    gen = torch.Generator().manual_seed(0)
    cases = []
    with torch.inference_mode():
        for batch, context in args.cases:
            cases.append(run_case(model, specs, batch, context, args.repeats, bandwidth,
                                  gen))
            print_case(cases[-1])
    base = next((c for c in cases if c.batch == 1), None)
    if base is not None:
        print(f"\nagainst B=1 context={base.context} (tokens/s per step, measured | at the bound):")
        for c in cases:
            if c is base:
                continue
            measured = c.batch * base.step_ms / c.step_ms
            bound = c.batch * base.bound_ms / c.bound_ms
            print(f"  B={c.batch} context={c.context}: {measured:.2f}x | {bound:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"model": str(args.model), "read_gbps": bandwidth,
                                         "threads": threads,
                                         "cases": [asdict(c) for c in cases]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
