"""CPU expert kernel edge cases against the fp32 reference on every ISA this machine runs:
rows with more groups than one scale chunk, group sizes 64 and 96, zero points 0..255, E8M0
scales 0 and 1, duplicated (token, expert) routes; and concurrent async submits from several
Python threads with out-of-order waits, dropped handles and rejected submits in between."""

from __future__ import annotations

import random
import threading

import pytest
import torch

from freetoken.ops.cpu_moe import (
    ExpertBankView,
    build_banks,
    cpu_moe_reference_banks,
    relative_rms_error,
)
from freetoken.ops.cpu_moe.cpu import cpu_moe_banks, submit_banks, supported_isas

TOL = 1e-5  # relative RMS error vs the reference on the same (dequantised) weights


def _banks(g: torch.Generator, fmt: str, n: int, h: int, i: int, group: int = 32,
           zeros: bool = False, scale_lo: int = 100, scale_hi: int = 130) -> ExpertBankView:
    def bank(rows: int, cols: int):
        codes = torch.randint(0, 256, (n, rows, cols // 2), generator=g, dtype=torch.uint8)
        if fmt == "mxfp4":
            scales = torch.randint(scale_lo, scale_hi, (n, rows, cols // 32), generator=g,
                                   dtype=torch.uint8)
            return codes.view(n, rows, cols // 32, 16), scales
        scales = (torch.rand(n, rows, cols // group, generator=g) * 0.01 + 0.001).half()
        if zeros:
            points = torch.randint(0, 256, (n, rows, cols // group), generator=g,
                                   dtype=torch.uint8)
            return codes, scales, points
        return codes, scales

    return ExpertBankView(fmt, bank(2 * i, h), bank(h, i), n, h, i)


CASES = [
    ("mxfp4", {}, 4096, 96),                         # 128 groups per gate_up row
    ("mxfp4", {}, 2080, 160),                        # 65 groups: a remainder after quads
    ("mxfp4", {"scale_lo": 0, "scale_hi": 6}, 256, 64),  # E8M0 0 and 1: subnormal scales
    ("q4g", {}, 4160, 96),                           # 130 groups
    ("q4g", {"zeros": True}, 2112, 96),              # zero points 0..255
    ("q4g", {"group": 64, "zeros": True}, 4224, 192),  # groups of 64
    ("q4g", {"group": 96}, 288, 96),                 # groups of 96
]


@pytest.mark.parametrize(("fmt", "kw", "h", "i"), CASES)
def test_odd_group_counts_sizes_and_zero_points_match_the_reference(fmt, kw, h, i) -> None:
    g = torch.Generator().manual_seed(h + i)
    banks = _banks(g, fmt, 6, h, i, **kw)
    for t, k in [(1, 4), (2, 3), (5, 2)]:
        x = torch.randn(t, h, generator=g)
        tok = torch.arange(t).repeat_interleave(k)
        if t == 2:
            ids = torch.tensor([1, 1, 2, 1, 1, 3])  # duplicated routes of one token
        else:
            ids = torch.stack([torch.randperm(6, generator=g)[:k] for _ in range(t)]).flatten()
        w = torch.rand(t * k, generator=g)
        ref = cpu_moe_reference_banks(x, tok, ids, w, banks)
        for isa in supported_isas():
            out = cpu_moe_banks(x, tok, ids, w, banks, isa=isa)
            assert torch.isfinite(out).all(), (isa, t)
            assert relative_rms_error(ref, out) < TOL, (isa, t)


def test_concurrent_submits_from_threads_with_out_of_order_waits() -> None:
    g = torch.Generator().manual_seed(0)
    banks = {f: build_banks(torch.randn(8, 128, 256, generator=g) / 16,
                            torch.randn(8, 256, 64, generator=g) / 8, f)
             for f in ("bf16", "mxfp4", "q4g")}
    cases = []
    for s in range(24):
        t = 1 + s % 5
        x = torch.randn(t, 256, generator=g)
        tok = torch.arange(t).repeat_interleave(2)
        ids = torch.randint(0, 8, (2 * t,), generator=g)
        w = torch.rand(2 * t, generator=g)
        fmt = ("bf16", "mxfp4", "q4g")[s % 3]
        cases.append((fmt, x, tok, ids, w, cpu_moe_reference_banks(x, tok, ids, w, banks[fmt])))
    errors: list = []

    def worker(seed: int) -> None:
        rnd = random.Random(seed)
        for _ in range(12):
            handles = [(i, submit_banks(*cases[i][1:5], banks[cases[i][0]]))
                       for i in rnd.sample(range(len(cases)), 5)]
            if rnd.random() < 0.3:  # an expert id outside the bank is refused at submit
                try:
                    submit_banks(cases[0][1], cases[0][2], cases[0][3] * 0 + 99, cases[0][4],
                                 banks["q4g"])
                    errors.append("no error for a bad expert id")
                except ValueError:
                    pass
            rnd.shuffle(handles)
            for j, (i, handle) in enumerate(handles):
                if j == len(handles) - 1 and rnd.random() < 0.5:
                    del handle  # dropped without wait: the destructor must finish it
                    continue
                tol = 1e-2 if cases[i][0] == "bf16" else TOL
                err = relative_rms_error(cases[i][5], handle.wait())
                if not err <= tol:
                    errors.append((i, err))

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not any(th.is_alive() for th in threads)
    assert errors == []
