"""CPU expert kernel effective bandwidth vs this machine's memory bandwidth (issue 3, benchmark 1).

Effective bandwidth = bytes of expert weights read / second (bf16 gate_up and down rows of every
distinct routed expert, once per call). Baselines measured in the same run: a large tensor copy
(bytes read + written / s) and a large tensor sum (bytes read / s), and a plain torch per-expert
loop over the same banks. Correctness is checked against the fp32 reference before timing.

Run: ``python -m evals.bench_cpu_moe [--experts 48] [--iters 40]`` (about a minute, ~1 GiB RAM).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from freetoken.ops.cpu_moe import TOLERANCE, cpu_moe_reference, relative_rms_error
from freetoken.ops.cpu_moe.cpu import cpu_moe, num_threads, submit, supported_isas


def _median_s(fn, iters: int) -> float:
    fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def memory_bandwidth(mib: int = 512, iters: int = 7) -> tuple[float, float]:
    """(copy GB/s counting read + write bytes, read-only sum GB/s) on a ``mib`` MiB fp32 tensor."""
    src = torch.rand(mib * 2**20 // 4)
    dst = torch.empty_like(src)
    copy_s = _median_s(lambda: dst.copy_(src), iters)
    sum_s = _median_s(lambda: src.sum(), iters)
    nbytes = src.numel() * 4
    return 2 * nbytes / copy_s / 1e9, nbytes / sum_s / 1e9


def torch_per_expert(x, tok, ids, w, gate_up, down) -> torch.Tensor:
    """Plain torch baseline: one bf16 F.linear pair per routed expert, index_add into fp32."""
    i = down.shape[2]
    out = torch.zeros(x.shape[0], down.shape[1])
    xb = x.bfloat16()
    for e in torch.unique(ids).tolist():
        sel = (ids == e).nonzero().flatten()
        gu = F.linear(xb[tok[sel]], gate_up[e])  # [n, 2I]
        y = F.linear(F.silu(gu[:, :i]) * gu[:, i:], down[e])  # [n, H]
        out.index_add_(0, tok[sel], y.float() * w[sel, None])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--experts", type=int, default=48, help="bank rows N (> top-k x iters / L3)")
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--iters", type=int, default=40)
    args = ap.parse_args()
    h, i, n, k = args.hidden, args.intermediate, args.experts, args.top_k
    torch.manual_seed(0)
    gate_up = (torch.randn(n, 2 * i, h) / h**0.5).bfloat16()  # [N, 2I, H]
    down = (torch.randn(n, h, i) / i**0.5).bfloat16()  # [N, H, I]
    expert_bytes = 3 * h * i * 2
    copy_gbs, read_gbs = memory_bandwidth()
    print(f"threads: kernel {num_threads()}, torch {torch.get_num_threads()}; "
          f"banks {n} x {expert_bytes / 2**20:.1f} MiB; ISAs {', '.join(supported_isas())}")
    print(f"memory: copy {copy_gbs:.1f} GB/s (read+write), sum {read_gbs:.1f} GB/s (read)")
    print(f"{'impl':<22}{'T':>4}{'experts':>9}{'ms/call':>10}{'GB/s':>8}"
          f"{'/copy':>8}{'/read':>8}")
    gen = torch.Generator().manual_seed(1)
    for t in (1, 4):
        routings = []
        for _ in range(args.iters + 1):
            ids = torch.stack([torch.randperm(n, generator=gen)[:k] for _ in range(t)]).flatten()
            routings.append((torch.arange(t).repeat_interleave(k), ids,
                             torch.rand(t * k, generator=gen)))
        x = torch.randn(t, h)
        ref = cpu_moe_reference(x, *routings[0], gate_up, down)
        impls = {f"kernel {isa}": (lambda r, isa=isa: cpu_moe(x, *r, gate_up, down, isa=isa))
                 for isa in supported_isas()}
        impls["torch per-expert bf16"] = lambda r: torch_per_expert(x, *r, gate_up, down)
        for name, fn in impls.items():
            err = relative_rms_error(ref, fn(routings[0]))
            assert err <= TOLERANCE[torch.bfloat16] * 2, f"{name}: error {err:.3g}"
            times, nbytes = [], []
            for r in routings[1:]:
                t0 = time.perf_counter()
                fn(r)
                times.append(time.perf_counter() - t0)
                nbytes.append(len(torch.unique(r[1])) * expert_bytes)
            s = statistics.median(times)
            gbs = statistics.median(nbytes) / s / 1e9
            print(f"{name:<22}{t:>4}{statistics.median(nbytes) / expert_bytes:>9.0f}"
                  f"{s * 1e3:>10.2f}{gbs:>8.1f}{gbs / copy_gbs:>8.2f}{gbs / read_gbs:>8.2f}")
    # Asynchrony: how long the caller is held by submit() (the rest of the call runs on the pool).
    submit_s = []
    for r in routings[1:]:
        t0 = time.perf_counter()
        hd = submit(x, *r, gate_up, down)
        submit_s.append(time.perf_counter() - t0)
        hd.wait()
    print(f"submit() returns in {statistics.median(submit_s) * 1e3:.3f} ms (median, T={t})")


if __name__ == "__main__":
    main()
