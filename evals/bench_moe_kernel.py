"""MoE benchmark item 1: CPU expert kernel bandwidth per weight format vs this machine's memory.

At decode shapes (1 token routed to top-k distinct experts drawn afresh each call from N, so the
experts' weights come from DRAM, not cache), for each weight format (bf16, fp32, mxfp4, q4g, fp8
with 128 x 128 blocks, nvfp4) and
each ISA variant of the kernel, plus a plain torch per-expert baseline (dequantise the expert,
then two ``F.linear``), it reports the effective bandwidth: bytes of expert weights the call must
read (codes + scales + zero points of every distinct routed expert, once) per second of its median
wall time, and the ratio of that to two same-run baselines on a large fp32 tensor:
``copy`` (``dst.copy_(src)``, counting bytes read + written, the STREAM convention) and ``read``
(``src.sum()``, bytes read). The kernel's goal is >= 0.85 of copy. Each (format, ISA) result is
first checked against the fp32 reference on the dequantised weights. The rows ``mxfp4+q8`` and
``q4g+q8`` run the same banks with int8 activations (``activations="q8"``), checked against the
q8 reference up to rounding ambiguity (``rounding.q8_accumulation_error``,
``Q8_ACCUMULATION_TOLERANCE``); ``bf16+bf16`` and ``fp8+bf16`` run the bf16 / fp8 banks with
bf16 activations (``vdpbf16ps`` on ``avx512_bf16``; fp8 there needs AVX512_VBMI too), checked
likewise (``BF16_ACCUMULATION_TOLERANCE``). These rows have no torch baseline. Every ISA variant the CPU supports gets its own row.

Run: ``python -m evals.bench_moe_kernel [--shapes small,large] [--iters 30]`` (about a minute,
peak ~2.5 GiB RAM for the fp32 banks of the larger shape). ``run(args)`` returns the table rows.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from freetoken.ops.cpu_moe import (
    FP32_ACCUMULATION_TOLERANCE,
    Q8_ACCUMULATION_TOLERANCE,
    BF16_ACCUMULATION_TOLERANCE,
    ExpertBankView,
    cpu_moe_reference_banks,
    relative_rms_error,
)
from freetoken.ops.cpu_moe.cpu import cpu_moe_banks, num_threads, supported_isas
from freetoken.ops.cpu_moe.formats import dequantize_bank
from freetoken.ops.cpu_moe.rounding import bf16_accumulation_error, q8_accumulation_error

# name: (H, I, N flat experts, top-k). "small" is the small preset (64 experts x 12 layers).
SHAPES = {"small": (1024, 256, 64 * 12, 8), "large": (2048, 768, 128, 8)}
# "+q8": int8 activations; "+bf16": bf16 activations.
FORMATS = ("bf16", "fp32", "mxfp4", "q4g", "fp8", "nvfp4", "mxfp4+q8", "q4g+q8", "bf16+bf16",
           "fp8+bf16")
FP8_BLOCK = (128, 128)


def _median_s(fn: Callable[[], object], iters: int) -> float:
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


def random_banks(fmt: str, n: int, h: int, i: int, seed: int = 0) -> ExpertBankView:
    """Banks of random weights stored directly in ``fmt`` (quantised: random codes, realistic
    scales; q4g symmetric, groups of 32; fp8 without NaN codes), without a float copy of the
    whole set."""
    g = torch.Generator().manual_seed(seed)

    def bank(rows: int, cols: int) -> tuple[torch.Tensor, ...]:
        if fmt in ("bf16", "fp32"):
            dt = torch.bfloat16 if fmt == "bf16" else torch.float32
            return ((torch.randn(n, rows, cols, generator=g) / cols**0.5).to(dt),)
        if fmt == "fp8":
            codes = torch.randint(0, 256, (n, rows, cols), generator=g, dtype=torch.uint8)
            codes[(codes & 0x7F) == 0x7F] = 0x38
            grid = (n, -(-rows // FP8_BLOCK[0]), -(-cols // FP8_BLOCK[1]))
            return codes.view(torch.float8_e4m3fn), torch.rand(grid, generator=g) * 1e-3 + 1e-4
        codes = torch.randint(0, 256, (n, rows, cols // 2), generator=g, dtype=torch.uint8)
        if fmt == "nvfp4":
            scales = torch.randint(0x30, 0x48, (n, rows, cols // 16), generator=g,
                                   dtype=torch.uint8).view(torch.float8_e4m3fn)
            return codes, scales, torch.rand(n, rows, generator=g) * 1e-2 + 1e-3
        if fmt == "mxfp4":
            scales = torch.randint(118, 122, (n, rows, cols // 32), generator=g, dtype=torch.uint8)
            return codes.view(n, rows, cols // 32, 16), scales
        scales = (torch.rand(n, rows, cols // 32, generator=g) * 0.01 + 0.005).half()
        return codes, scales

    return ExpertBankView(fmt, bank(2 * i, h), bank(h, i), n, h, i,
                          block_size=FP8_BLOCK if fmt == "fp8" else None)


def torch_per_expert(x, tok, ids, w, banks: ExpertBankView) -> torch.Tensor:
    """Plain torch baseline: per routed expert, dequantise (4-bit; dense banks are used as they
    are, in their own dtype) and run the two ``F.linear``; index_add into fp32 ``[T, H]``."""
    i = banks.intermediate
    out = torch.zeros(x.shape[0], banks.hidden)
    dense = banks.format in ("bf16", "fp32")
    xd = x.to(banks.gate_up[0].dtype) if dense else x
    for e in torch.unique(ids).tolist():
        sel = (ids == e).nonzero().flatten()
        if dense:
            gu_w, dn_w = banks.gate_up[0][e], banks.down[0][e]
        else:
            gu_w = dequantize_bank(banks.format, tuple(t[e : e + 1] for t in banks.gate_up),
                                   block_size=banks.block_size)[0]
            dn_w = dequantize_bank(banks.format, tuple(t[e : e + 1] for t in banks.down),
                                   block_size=banks.block_size)[0]
        gu = F.linear(xd[tok[sel]], gu_w)  # [n, 2I]
        y = F.linear(F.silu(gu[:, :i]) * gu[:, i:], dn_w)  # [n, H]
        out.index_add_(0, tok[sel], y.float() * w[sel, None])
    return out


def _routings(n: int, k: int, count: int, seed: int) -> list[tuple[torch.Tensor, ...]]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.zeros(k, dtype=torch.int64), torch.randperm(n, generator=gen)[:k],
             torch.rand(k, generator=gen)) for _ in range(count)]


def bench_shape(name: str, args: argparse.Namespace, copy_gbs: float, read_gbs: float) -> list:
    """Rows for one shape: every format x (kernel ISAs + torch baseline)."""
    h, i, n, k = SHAPES[name]
    rows = []
    x = torch.randn(1, h, generator=torch.Generator().manual_seed(0))
    routings = _routings(n, k, args.iters + 1, seed=1)
    for fmt in args.formats:
        bank_fmt, _, act = fmt.partition("+")
        act = act or "fp32"
        banks = random_banks(bank_fmt, n, h, i)
        nbytes = k * banks.expert_nbytes()
        impls = {f"kernel {isa}": (lambda r, isa=isa: cpu_moe_banks(x, *r, banks, isa=isa,
                                                                    activations=act))
                 for isa in supported_isas()}
        if act == "fp32":
            impls["torch per-expert"] = lambda r: torch_per_expert(x, *r, banks)
            ref = cpu_moe_reference_banks(x, *routings[0], banks)

            def error(out: torch.Tensor) -> float:
                return relative_rms_error(ref, out)
        elif act == "q8":
            def error(out: torch.Tensor) -> float:
                return q8_accumulation_error(out, x, *routings[0], banks)
        else:
            dense = (banks.gate_up[0], banks.down[0]) if bank_fmt == "bf16" else \
                banks.dequantize()

            def error(out: torch.Tensor) -> float:
                return bf16_accumulation_error(out, x, *routings[0], *dense)
        bounds = {"fp32": FP32_ACCUMULATION_TOLERANCE, "q8": Q8_ACCUMULATION_TOLERANCE,
                  "bf16": BF16_ACCUMULATION_TOLERANCE}
        for impl, fn in impls.items():
            err = error(fn(routings[0]))
            bound = bounds[act] if impl.startswith("kernel") else 1e-2
            assert err <= bound, f"{name} {fmt} {impl}: error {err:.3g} > {bound}"
            times = []
            kernel = impl.startswith("kernel")
            timed = routings[1:] if kernel else routings[1 : 1 + args.torch_iters]
            for r in timed:
                t0 = time.perf_counter()
                fn(r)
                times.append(time.perf_counter() - t0)
            s = statistics.median(times)
            gbs = nbytes / s / 1e9
            rows.append(dict(shape=name, hidden=h, intermediate=i, experts=n, top_k=k, format=fmt,
                             impl=impl, ms=s * 1e3, gb_s=gbs, vs_copy=gbs / copy_gbs,
                             vs_read=gbs / read_gbs, expert_mib=banks.expert_nbytes() / 2**20,
                             rel_err=err))
        del banks
    return rows


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="small,large", help=f"comma list of {sorted(SHAPES)}")
    ap.add_argument("--formats", default=",".join(FORMATS), help="comma list of formats")
    ap.add_argument("--iters", type=int, default=30, help="timed kernel calls per (format, ISA)")
    ap.add_argument("--torch-iters", type=int, default=5, help="timed torch baseline calls")
    return ap


def run(args: argparse.Namespace | None = None) -> list[dict]:
    """Runs the benchmark, prints the table, returns one dict per (shape, format, impl) plus a
    first ``impl="memory"`` row holding ``copy_gb_s`` / ``read_gb_s``."""
    args = args if args is not None else build_parser().parse_args([])
    if isinstance(args.formats, str):
        args.formats = [f for f in args.formats.split(",") if f]
    copy_gbs, read_gbs = memory_bandwidth()
    print(f"threads: kernel {num_threads()}, torch {torch.get_num_threads()}; "
          f"ISAs {', '.join(supported_isas())}")
    print(f"memory: copy {copy_gbs:.1f} GB/s (read+write bytes), sum {read_gbs:.1f} GB/s (read)")
    rows: list[dict] = [dict(impl="memory", copy_gb_s=copy_gbs, read_gb_s=read_gbs)]
    print(f"{'shape':<7}{'format':<10}{'impl':<20}{'MiB/exp':>8}{'ms/call':>9}{'GB/s':>7}"
          f"{'/copy':>7}{'/read':>7}")
    for name in args.shapes.split(","):
        for row in bench_shape(name, args, copy_gbs, read_gbs):
            rows.append(row)
            print(f"{row['shape']:<7}{row['format']:<10}{row['impl']:<20}{row['expert_mib']:>8.2f}"
                  f"{row['ms']:>9.3f}{row['gb_s']:>7.1f}{row['vs_copy']:>7.2f}"
                  f"{row['vs_read']:>7.2f}")
    return rows


def main() -> None:
    run(build_parser().parse_args())


if __name__ == "__main__":
    main()
