"""Which ``rows_dot`` kernel each ISA variant runs (csrc isa.h ``rows_kernel_for``), observed
through the extension's per-kernel call counts, so a variant cannot silently fall back to
another's code. Every variant this CPU supports is checked."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from freetoken.ops.cpu_moe import build_banks
from freetoken.ops.cpu_moe.cpu import (
    cpu_has_avx512_vbmi,
    cpu_has_avx512_vnni,
    cpu_moe_banks,
    kernel_runnable,
    kernels,
    supported_isas,
)

ISAS = supported_isas()
# The avx512 variants' q8 kernel needs AVX512_VNNI as well (isa.h rows_kernel_for).
VNNI = "avx512_vnni" in Path("/proc/cpuinfo").read_text().split()
Q8_AVX512 = "q8_avx512_vnni" if "avx512" in ISAS and VNNI else "q8_avx2"
# fp8 with bf16 activations on avx512_bf16 needs AVX512_VBMI for its own kernel.
VBMI = "avx512vbmi" in Path("/proc/cpuinfo").read_text().split()
FP8_BF16 = "fp8_dpbf16" if "avx512_bf16" in ISAS and VBMI else "fp8_avx512"

# (isa, format, activations) -> the kernel(s) it must run, from isa.h.
EXPECTED = {
    "scalar": {("bf16", "fp32"): "bf16_scalar", ("fp32", "fp32"): "f32_scalar",
               ("q4g", "fp32"): "q4_scalar", ("q4g", "q8"): "q8_scalar",
               ("bf16", "bf16"): "bf16_scalar", ("fp8", "fp32"): "fp8_scalar",
               ("fp8", "bf16"): "fp8_scalar", ("nvfp4", "fp32"): "nvfp4_scalar"},
    "avx2": {("bf16", "fp32"): "bf16_avx2", ("fp32", "fp32"): "f32_avx2",
             ("q4g", "fp32"): "q4_avx2", ("q4g", "q8"): "q8_avx2",
             ("bf16", "bf16"): "bf16_avx2", ("fp8", "fp32"): "fp8_avx2",
             ("fp8", "bf16"): "fp8_avx2", ("nvfp4", "fp32"): "nvfp4_avx2"},
    "avx512": {("bf16", "fp32"): "bf16_avx512", ("fp32", "fp32"): "f32_avx512",
               ("q4g", "fp32"): "q4_avx2", ("q4g", "q8"): Q8_AVX512,
               ("bf16", "bf16"): "bf16_avx512", ("fp8", "fp32"): "fp8_avx512",
               ("fp8", "bf16"): "fp8_avx512", ("nvfp4", "fp32"): "nvfp4_avx2"},
    "avx512_bf16": {("bf16", "fp32"): "bf16_avx512", ("fp32", "fp32"): "f32_avx512",
                    ("q4g", "fp32"): "q4_avx2", ("q4g", "q8"): Q8_AVX512,
                    ("bf16", "bf16"): "bf16_dpbf16", ("fp8", "fp32"): "fp8_avx512",
                    ("fp8", "bf16"): FP8_BF16, ("nvfp4", "fp32"): "nvfp4_avx2"},
}
ROWS_KERNELS = 18  # rows_dot kernels (isa.cpp all_rows_kernels), listed first


def _counts() -> dict[str, int]:
    return {name: calls for name, _, calls in kernels()}


def test_vnni_detection_agrees_with_the_cpu_flags():
    assert cpu_has_avx512_vnni() == ("avx512" in ISAS and VNNI)
    assert kernel_runnable("q8_avx512_vnni", "avx512") == ("avx512" in ISAS and VNNI)
    assert kernel_runnable("q8_avx2", "avx2") == ("avx2" in ISAS)


def test_vbmi_detection_agrees_with_the_cpu_flags():
    assert cpu_has_avx512_vbmi() == ("avx512_bf16" in ISAS and VBMI)
    assert kernel_runnable("fp8_dpbf16", "avx512_bf16") == ("avx512_bf16" in ISAS and VBMI)


def test_kernel_table_names_every_variant():
    table = kernels()
    names = [n for n, _, _ in table]
    assert len(names) == len(set(names)) == ROWS_KERNELS + 6
    assert {i for _, i, _ in table} == {"scalar", "avx2", "avx512", "avx512_bf16"}
    expected = {k for per_isa in EXPECTED.values() for k in per_isa.values()}
    expected.add("q8_avx512_vnni")  # listed on every CPU, run only with AVX512_VNNI
    expected.add("fp8_dpbf16")  # listed on every CPU, run only with AVX512_BF16 and VBMI
    # the rows_dot kernels first, then the decode attention cores and delta-rule steps
    # (tests/ops/test_attention_decode.py, tests/ops/test_gdn_decode.py)
    assert expected == set(names[:ROWS_KERNELS])
    assert [(n, i) for n, i, _ in table[ROWS_KERNELS:]] == [
        (f"{kind}_{isa}", isa) for kind in ("attend", "delta_rule")
        for isa in ("scalar", "avx2", "avx512")]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt,act", [("bf16", "fp32"), ("fp32", "fp32"), ("q4g", "fp32"),
                                     ("q4g", "q8"), ("bf16", "bf16"), ("fp8", "fp32"),
                                     ("fp8", "bf16"), ("nvfp4", "fp32")])
def test_variant_runs_its_own_kernel(isa, fmt, act):
    g = torch.Generator().manual_seed(0)
    banks = build_banks(torch.randn(3, 64, 64, generator=g), torch.randn(3, 64, 32, generator=g),
                        fmt)
    x = torch.randn(2, 64, generator=g)
    tri = (torch.tensor([0, 1]), torch.tensor([0, 2]), torch.tensor([0.5, 0.5]))
    before = _counts()
    cpu_moe_banks(x, *tri, banks, isa=isa, activations=act)
    after = _counts()
    ran = {n for n in after if after[n] != before[n]}
    assert ran == {EXPECTED[isa][(fmt, act)]}
    assert after[EXPECTED[isa][(fmt, act)]] == before[EXPECTED[isa][(fmt, act)]] + 1
