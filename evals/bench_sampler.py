"""Per-step sampler cost: the per-row reference loop against the batched sampler.

For each batch size B and request mix, one step's logits ``[B, V]`` (bf16-rounded random values,
V = 151,936 by default: the Qwen3 vocabulary) are sampled both ways: ``per-row`` is what the
runner did before batching (one ``engine.sampler.sample`` call per row, each ending in
``.item()``), ``batched`` is what it does now (``SamplingRows.build`` + one ``sample_batch``).
Both sides get their own generators seeded alike and must pick identical tokens and logprobs on
every timed step (checked, not assumed); the median wall time of a step is reported, and the
ratio per-row / batched.

Mixes: ``greedy`` (temperature 0), ``sample`` (temperature 1, no filters: the API default),
``filtered`` (temperature 0.7, top-k 50, top-p 0.9), ``logprobs`` (greedy with 5 alternatives),
``mixed`` (the four kinds in turn).

Run: ``python -m evals.bench_sampler [--batch 1,4,8] [--vocab 151936] [--iters 30]
[--threads N]`` (under a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from freetoken.core import SamplingParams
from freetoken.engine.batch_sampler import sample_batch
from freetoken.engine.sampler import make_generator, sample
from freetoken.engine.sampling_rows import SamplingRows

MIXES = {
    "greedy": [SamplingParams(temperature=0.0)],
    "sample": [SamplingParams(temperature=1.0)],
    "filtered": [SamplingParams(temperature=0.7, top_k=50, top_p=0.9)],
    "logprobs": [SamplingParams(temperature=0.0, logprobs=5)],
    "mixed": [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0),
              SamplingParams(temperature=0.7, top_k=50, top_p=0.9),
              SamplingParams(temperature=0.0, logprobs=5)],
}


def _step_times(logits: torch.Tensor, params: list[SamplingParams], iters: int
                ) -> tuple[float, float]:
    """Median seconds per step of the per-row loop and of the batched call."""
    v = logits.shape[-1]
    ref_gens = [make_generator(i) for i in range(len(params))]
    new_gens = [make_generator(i) for i in range(len(params))]
    ref_t, new_t = [], []
    for _ in range(iters + 2):  # the first two are warm-up
        t0 = time.perf_counter()
        want = [sample(logits[i], p, g) for i, (p, g) in enumerate(zip(params, ref_gens))]
        t1 = time.perf_counter()
        got = sample_batch(logits, SamplingRows.build(params, new_gens, v, logits.device))
        t2 = time.perf_counter()
        if got != want:
            raise SystemExit("batched sampler differs from the per-row reference")
        ref_t.append(t1 - t0)
        new_t.append(t2 - t1)
    return statistics.median(ref_t[2:]), statistics.median(new_t[2:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", default="1,4,8")
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"vocab {args.vocab}, torch threads {torch.get_num_threads()}, median of {args.iters}")
    print(f"{'mix':<9} {'B':>2} {'per-row ms':>11} {'batched ms':>11} {'ratio':>6}")
    with torch.inference_mode():
        for mix, kinds in MIXES.items():
            for b in (int(x) for x in args.batch.split(",")):
                g = torch.Generator().manual_seed(b)
                logits = (torch.randn(b, args.vocab, generator=g) * 3).to(torch.bfloat16).float()
                params = [kinds[i % len(kinds)] for i in range(b)]
                ref, new = _step_times(logits, params, args.iters)
                print(f"{mix:<9} {b:>2} {ref * 1e3:>11.3f} {new * 1e3:>11.3f} {ref / new:>6.2f}")


if __name__ == "__main__":
    main()
