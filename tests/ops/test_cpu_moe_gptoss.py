"""The C++ CPU expert kernel's gpt-oss mode (gate/up and down biases, clamped SwiGLU with
``alpha``) against the torch references, in every weight format, activation mode and ISA variant.

Bounds are the kernel's own (``freetoken.ops.cpu_moe``): fp32 activations within
``FP32_ACCUMULATION_TOLERANCE`` of ``cpu_moe_reference_banks`` with the same options; bf16 and
q8 activations within their accumulation tolerances of their references up to rounding
ambiguity (``rounding.py``) and within ``BF16_TOLERANCE`` / ``Q8_TOLERANCE`` of the fp32
reference. The data makes the clamps bite: ``g`` and ``u`` have a standard deviation of about
4 (biases included) against ``swiglu_limit = 7``, and every problem asserts that some ``g`` are
above the limit and some ``u`` beyond both ends of it. Routings have odd token, expert and
top-k counts, ``-1`` (skipped) entries, and several tokens per expert.
Shape letters: T tokens, H hidden, I expert intermediate, N flat expert ids, K top-k.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from freetoken.ops.cpu_moe import (
    BF16_ACCUMULATION_TOLERANCE,
    BF16_TOLERANCE,
    FP32_ACCUMULATION_TOLERANCE,
    Q8_ACCUMULATION_TOLERANCE,
    Q8_TOLERANCE,
    ExpertBankView,
    build_banks,
    cpu_moe_reference_banks,
    relative_rms_error,
)
from freetoken.ops.cpu_moe.cpu import cpu_moe, cpu_moe_banks, supported_isas
from freetoken.ops.cpu_moe.rounding import bf16_accumulation_error, q8_accumulation_error

ISAS = supported_isas()
LIMIT = 7.0  # gpt-oss's swiglu_limit
REPO = Path(__file__).resolve().parents[2]
# (format, build_banks kwargs), as in test_cpu_moe_formats.py.
VARIANTS = [
    ("bf16", {}),
    ("fp32", {}),
    ("mxfp4", {}),
    ("q4g", {}),
    ("q4g", dict(symmetric=False)),
    ("q4g", dict(group_size=64, symmetric=False)),
]
VARIANT_IDS = ["bf16", "fp32", "mxfp4", "q4g-sym32", "q4g-asym32", "q4g-asym64"]
# H and I are multiples of 64 (q4g groups of 64); T, N and K odd. With 2 threads the 9 routed
# experts of decode-N33 run one task per expert, the others the chunked phases (both schedules
# are compared bit for bit in test_schedules_are_bit_identical).
SHAPES = [
    pytest.param(1, 128, 64, 5, 3, id="decode-T1-N5-K3"),
    pytest.param(1, 64, 128, 33, 9, id="decode-T1-N33-K9"),
    pytest.param(7, 192, 64, 9, 3, id="prefill-T7-N9-K3"),
    pytest.param(37, 64, 192, 7, 5, id="prefill-T37-N7-K5"),
]


@functools.cache
def _weights(n: int, h: int, i: int, seed: int) -> tuple[torch.Tensor, ...]:
    """fp32 ``gate_up [N, 2I, H]``, ``down [N, H, I]``, ``gate_up_bias [N, 2I]``, ``down_bias
    [N, H]``: gate/up rows scaled so that ``g`` and ``u`` reach past the limit."""
    g = torch.Generator().manual_seed(seed)
    gate_up = torch.randn(n, 2 * i, h, generator=g) * (3.5 / h**0.5)
    down = torch.randn(n, h, i, generator=g) / i**0.5
    return (gate_up, down, torch.randn(n, 2 * i, generator=g) * 2.0,
            torch.randn(n, h, generator=g))


@functools.cache
def _banks(fmt: str, kwargs: tuple, n: int, h: int, i: int, seed: int) -> ExpertBankView:
    """Built once per session for the ISA variants that share them (4-bit quantising is slow)."""
    gate_up, down, _, _ = _weights(n, h, i, seed)
    return build_banks(gate_up, down, fmt, **dict(kwargs))


def _problem(fmt, kwargs, t, h, i, n, k, seed=0):
    """(banks, x [T, H], routing triples, gpt-oss keywords) with ``-1`` entries mixed in and,
    for T > 1, a last token whose entries are all ``-1``."""
    banks = _banks(fmt, tuple(sorted(kwargs.items())), n, h, i, seed)
    _, _, gate_up_bias, down_bias = _weights(n, h, i, seed)
    g = torch.Generator().manual_seed(seed + 7 * t + k)
    x = torch.randn(t, h, generator=g)
    ids = torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(t)]).flatten()  # [T*K]
    ids[1::4] = -1
    if t > 1:
        ids[-k:] = -1
    tok = torch.arange(t).repeat_interleave(k)
    w = torch.rand(t * k, generator=g)
    glu = dict(gate_up_bias=gate_up_bias, down_bias=down_bias, swiglu_limit=LIMIT,
               swiglu_alpha=1.702)
    return banks, x, (tok, ids, w), glu


def _assert_clamps_bite(banks, x, tri, glu) -> None:
    """Some routed ``g > limit`` and some ``u`` beyond each side of the limit."""
    gate_up, _ = banks.dequantize()
    tok, ids, _ = tri
    i = banks.intermediate
    keep = ids >= 0
    gu = torch.einsum("ph,pjh->pj", x[tok[keep]], gate_up[ids[keep]])
    gu = gu + glu["gate_up_bias"][ids[keep]]
    g, u = gu[:, :i], gu[:, i:]
    assert (g > LIMIT).any() and (u > LIMIT).any() and (u < -LIMIT).any()
    assert (g.abs() < LIMIT).float().mean() > 0.5  # most of the activation is not clamped


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt,kwargs", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("t,h,i,n,k", SHAPES)
def test_fp32_activations_match_reference(isa, fmt, kwargs, t, h, i, n, k):
    banks, x, tri, glu = _problem(fmt, kwargs, t, h, i, n, k)
    _assert_clamps_bite(banks, x, tri, glu)
    ref = cpu_moe_reference_banks(x, *tri, banks, **glu)
    out = cpu_moe_banks(x, *tri, banks, isa=isa, **glu)
    assert out.shape == (t, h) and out.dtype == torch.float32
    err = relative_rms_error(ref, out)
    assert err <= FP32_ACCUMULATION_TOLERANCE, f"{fmt} {isa}: relative RMS error {err:.3g}"
    # The options matter: without them the result is far from the gpt-oss reference.
    assert relative_rms_error(ref, cpu_moe_banks(x, *tri, banks, isa=isa)) > 0.1
    if t > 1:  # a token whose entries are all skipped gets no down bias either
        assert torch.equal(out[-1], torch.zeros(h)) and out[:-1].abs().sum(-1).min() > 0


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("t,h,i,n,k", SHAPES)
def test_bf16_activations_match_bf16_reference(isa, t, h, i, n, k):
    banks, x, tri, glu = _problem("bf16", {}, t, h, i, n, k, seed=1)
    _assert_clamps_bite(banks, x, tri, glu)
    gate_up, down = banks.gate_up[0], banks.down[0]
    out = cpu_moe(x, *tri, gate_up, down, isa=isa, activations="bf16", **glu)
    err = bf16_accumulation_error(out, x, *tri, gate_up, down, **glu)
    assert err <= BF16_ACCUMULATION_TOLERANCE, f"{isa}: vs bf16 reference {err:.3g}"
    dense = relative_rms_error(cpu_moe_reference_banks(x, *tri, banks, **glu), out)
    assert 1e-4 < dense <= BF16_TOLERANCE, f"{isa}: vs fp32 reference {dense:.3g}"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt,kwargs", VARIANTS[2:], ids=VARIANT_IDS[2:])
@pytest.mark.parametrize("t,h,i,n,k", SHAPES)
def test_q8_activations_match_q8_reference(isa, fmt, kwargs, t, h, i, n, k):
    banks, x, tri, glu = _problem(fmt, kwargs, t, h, i, n, k, seed=2)
    _assert_clamps_bite(banks, x, tri, glu)
    out = cpu_moe_banks(x, *tri, banks, isa=isa, activations="q8", **glu)
    err = q8_accumulation_error(out, x, *tri, banks, **glu)
    assert err <= Q8_ACCUMULATION_TOLERANCE, f"{fmt} {isa}: vs q8 reference {err:.3g}"
    dense = relative_rms_error(cpu_moe_reference_banks(x, *tri, banks, **glu), out)
    assert 1e-4 < dense <= Q8_TOLERANCE, f"{fmt} {isa}: vs fp32 reference {dense:.3g}"


# Each option alone, and the gpt-oss activation unclamped (limit inf) with another alpha.
OPTION_SETS = {
    "gate_up_bias": ("gate_up_bias",),
    "down_bias": ("down_bias",),
    "limit": ("swiglu_limit",),
    "limit-inf-alpha1": ("swiglu_limit", "swiglu_alpha"),
}


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt,act", [("bf16", "fp32"), ("bf16", "bf16"), ("mxfp4", "q8"),
                                     ("q4g", "fp32")])
@pytest.mark.parametrize("option", OPTION_SETS)
def test_each_option_alone(isa, fmt, act, option):
    banks, x, tri, full = _problem(fmt, {}, 7, 192, 64, 9, 3, seed=3)
    glu = {name: full[name] for name in OPTION_SETS[option]}
    if option == "limit-inf-alpha1":
        glu.update(swiglu_limit=float("inf"), swiglu_alpha=1.0)
    out = cpu_moe_banks(x, *tri, banks, isa=isa, activations=act, **glu)
    assert relative_rms_error(cpu_moe_reference_banks(x, *tri, banks), out) > 1e-2  # it acts
    if act == "fp32":
        err = relative_rms_error(cpu_moe_reference_banks(x, *tri, banks, **glu), out)
        assert err <= FP32_ACCUMULATION_TOLERANCE, f"{option}: {err:.3g}"
    elif act == "bf16":
        err = bf16_accumulation_error(out, x, *tri, banks.gate_up[0], banks.down[0], **glu)
        assert err <= BF16_ACCUMULATION_TOLERANCE, f"{option}: {err:.3g}"
    else:
        err = q8_accumulation_error(out, x, *tri, banks, **glu)
        assert err <= Q8_ACCUMULATION_TOLERANCE, f"{option}: {err:.3g}"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt,act", [("bf16", "fp32"), ("fp32", "fp32"), ("bf16", "bf16"),
                                     ("mxfp4", "fp32"), ("q4g", "q8")])
def test_zero_biases_and_defaults_are_bit_identical_to_plain_swiglu(isa, fmt, act):
    """Zero biases add exact zeros, and the default keywords are the plain SwiGLU kernel."""
    banks, x, tri, full = _problem(fmt, {}, 37, 64, 192, 7, 5, seed=4)
    plain = cpu_moe_banks(x, *tri, banks, isa=isa, activations=act)
    zeros = dict(gate_up_bias=torch.zeros_like(full["gate_up_bias"]),
                 down_bias=torch.zeros_like(full["down_bias"]))
    assert torch.equal(plain, cpu_moe_banks(x, *tri, banks, isa=isa, activations=act, **zeros))
    assert torch.equal(plain, cpu_moe_banks(x, *tri, banks, isa=isa, activations=act,
                                            gate_up_bias=None, down_bias=None,
                                            swiglu_limit=None, swiglu_alpha=1.702))


@pytest.mark.parametrize("isa", ISAS)
def test_dense_entry_point_and_nan_propagation(isa):
    """``cpu_moe`` (dense banks) equals ``cpu_moe_banks``; a NaN in one token's x makes exactly
    that token's output NaN (the clamps let NaN through, as torch.clamp does)."""
    banks, x, tri, glu = _problem("fp32", {}, 7, 192, 64, 9, 3, seed=5)
    out = cpu_moe(x, *tri, banks.gate_up[0], banks.down[0], isa=isa, **glu)
    assert torch.equal(out, cpu_moe_banks(x, *tri, banks, isa=isa, **glu))
    x = x.clone()
    x[2, 10] = float("nan")
    out = cpu_moe(x, *tri, banks.gate_up[0], banks.down[0], isa=isa, **glu)
    ref = cpu_moe_reference_banks(x, *tri, banks, **glu)
    assert torch.isnan(out[2]).all() and torch.isnan(ref[2]).all()
    rest = torch.tensor([0, 1, 3, 4, 5, 6])
    assert torch.isfinite(out[rest]).all()
    assert relative_rms_error(ref[rest], out[rest]) <= FP32_ACCUMULATION_TOLERANCE


SCHEDULE_SCRIPT = """
import sys, torch
from freetoken.ops.cpu_moe import build_banks
from freetoken.ops.cpu_moe.cpu import cpu_moe_banks
out = {}
for fmt, act, h, i, t, k in [("bf16", "fp32", 96, 80, 1, 9), ("fp32", "fp32", 64, 37, 3, 5),
                             ("q4g", "q8", 128, 64, 3, 9), ("bf16", "bf16", 64, 48, 1, 9),
                             ("mxfp4", "fp32", 64, 96, 5, 3), ("fp8", "fp32", 200, 72, 3, 5),
                             ("nvfp4", "fp32", 208, 48, 1, 9)]:
    g = torch.Generator().manual_seed(h + i)
    banks = build_banks(torch.randn(13, 2 * i, h, generator=g) * 3 / h**0.5,
                        torch.randn(13, h, i, generator=g), fmt)
    glu = dict(gate_up_bias=torch.randn(13, 2 * i, generator=g) * 2,
               down_bias=torch.randn(13, h, generator=g), swiglu_limit=7.0)
    x = torch.randn(t, h, generator=g)
    ids = torch.stack([torch.randperm(13, generator=g)[:k] for _ in range(t)]).flatten()
    ids[::4] = -1
    tok = torch.arange(t).repeat_interleave(k)
    w = torch.rand(t * k, generator=g)
    for isa in sys.argv[2].split(","):
        out[(fmt, act, isa)] = cpu_moe_banks(x, tok, ids, w, banks, isa=isa, activations=act,
                                             **glu)
torch.save(out, sys.argv[1])
"""


def _run_schedule_script(threads: int, path: Path) -> dict:
    env = dict(os.environ, FREETOKEN_CPU_MOE_THREADS=str(threads),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, "-c", SCHEDULE_SCRIPT, str(path), ",".join(ISAS)],
                   check=True, env=env, cwd=REPO)
    return torch.load(path)


def test_schedules_are_bit_identical(tmp_path):
    """One task per routed expert (a 1-thread pool) and the I / H chunked phases (16 threads,
    fewer than 2 routed experts per thread) apply the biases and the clamp identically."""
    one = _run_schedule_script(1, tmp_path / "one.pt")
    many = _run_schedule_script(16, tmp_path / "many.pt")
    assert one.keys() == many.keys() and len(one) == 7 * len(ISAS)
    for key in one:
        assert torch.equal(one[key], many[key]), key
