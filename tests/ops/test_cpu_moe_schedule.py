"""The CPU expert kernel's two schedules (one task per routed expert when there are at least two
experts per thread, else the I / H chunked phases) give bit-identical results: the same problems
run in processes whose kernel pool has 1 thread (per-expert tasks) and 16 threads (chunked)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from freetoken.ops.cpu_moe.cpu import supported_isas

REPO = Path(__file__).resolve().parents[2]
# (format, activations, H, I, tokens, top-k) — 8 routed experts, fewer than 2 * 16
SCRIPT = """
import sys, torch
from freetoken.ops.cpu_moe import build_banks
from freetoken.ops.cpu_moe.cpu import cpu_moe_banks
out = {}
for fmt, act, h, i, t, k in [("bf16", "fp32", 96, 80, 1, 8), ("fp32", "fp32", 64, 37, 3, 4),
                             ("q4g", "q8", 128, 64, 2, 8), ("bf16", "bf16", 64, 48, 1, 8),
                             ("mxfp4", "fp32", 64, 96, 4, 3)]:
    g = torch.Generator().manual_seed(h + i)
    banks = build_banks(torch.randn(12, 2 * i, h, generator=g), torch.randn(12, h, i, generator=g),
                        fmt)
    x = torch.randn(t, h, generator=g)
    ids = torch.stack([torch.randperm(12, generator=g)[:k] for _ in range(t)]).flatten()
    tok = torch.arange(t).repeat_interleave(k)
    w = torch.rand(t * k, generator=g)
    for isa in sys.argv[2].split(","):
        out[(fmt, act, isa)] = cpu_moe_banks(x, tok, ids, w, banks, isa=isa, activations=act)
torch.save(out, sys.argv[1])
"""


def _run(threads: int, path: Path) -> dict:
    env = dict(os.environ, FREETOKEN_CPU_MOE_THREADS=str(threads),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, "-c", SCRIPT, str(path), ",".join(supported_isas())],
                   check=True, env=env, cwd=REPO)
    return torch.load(path)


def test_per_expert_and_chunked_schedules_are_bit_identical(tmp_path):
    one, many = _run(1, tmp_path / "one.pt"), _run(16, tmp_path / "many.pt")
    assert one.keys() == many.keys() and len(one) == 5 * len(supported_isas())
    for key in one:
        assert torch.equal(one[key], many[key]), key
