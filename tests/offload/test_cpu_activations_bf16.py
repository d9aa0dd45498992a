"""``--moe-cpu-activations bf16`` end to end: the tiny models with their bf16 host banks and every
miss on the CPU kernel, bf16 activations against fp32 ones, and the refusals of bad combinations.

Bound: over a 12-token prefill and 15 teacher-forced decode steps, the relative RMS of the
logits of the bf16-activation run against the fp32-activation run stays <= LOGITS_BOUND = 2e-3
at every step and is > 0 (the rounding really ran; measured 3e-5 to 4e-5). Run once per ISA variant this CPU supports
(``vdpbf16ps`` on ``avx512_bf16``, the fp32 kernels on rounded values elsewhere). Greedy tokens
are not required to be identical.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from freetoken.cli import build_parser
from freetoken.launch import serve
from freetoken.models.registry import load_model
from freetoken.models.tiny import make_tiny
from freetoken.offload import loading
from freetoken.offload.backend import MoeConfig
from tests.offload.test_cpu_activations_q8 import teacher_forced_errors

LOGITS_BOUND = 2e-3


@pytest.mark.parametrize("arch", ["qwen3_next", "qwen3_moe", "qwen3_5_moe", "glm4_moe"])
def test_bf16_logits_stay_close_to_fp32_activations(tiny_checkpoint, arch, every_cpu_isa):
    path = tiny_checkpoint(arch)
    models = {act: load_model(path, moe=MoeConfig(backend="cpu", cache="1", cpu_activations=act))
              for act in ("fp32", "bf16")}
    assert models["bf16"].moe_runtime.cpu.activations == "bf16"
    errors = teacher_forced_errors(models["fp32"], models["bf16"])
    assert all(0 < e <= LOGITS_BOUND for e in errors), errors
    stats = models["bf16"].moe_runtime.stats()
    assert sum(layer.cpu_experts for layer in stats.layers) > 0


def test_fp8_banks_take_bf16_activations(tmp_path_factory, every_cpu_isa):
    """fp8 host banks with bf16 activations: logits within LOGITS_BOUND of fp32 ones; in a bf16
    model ``auto`` picks them."""
    path = make_tiny("qwen3_5_moe", "tiny", tmp_path_factory.mktemp("fp8") / "m", weights="fp8")
    models = {act: load_model(path, moe=MoeConfig(backend="cpu", cache="1", cpu_activations=act))
              for act in ("fp32", "bf16")}
    assert models["bf16"].moe_runtime.banks.format == "fp8"
    assert models["bf16"].moe_runtime.cpu.activations == "bf16"
    errors = teacher_forced_errors(models["fp32"], models["bf16"])
    assert all(0 < e <= LOGITS_BOUND for e in errors), errors
    auto = load_model(path, dtype=torch.bfloat16, moe=MoeConfig(backend="cpu", cache="1"))
    assert auto.moe_runtime.cpu.activations == "bf16"


def test_bf16_with_4bit_or_resident_or_fp32_banks_is_refused(tiny_checkpoint, monkeypatch):
    with pytest.raises(ValueError) as info:
        MoeConfig(backend="cpu", expert_format="q4g", cpu_activations="bf16")
    assert str(info.value) == ("--moe-cpu-activations bf16 needs bf16 host expert banks: use "
                               "--moe-expert-format dense (got q4g)")
    with pytest.raises(ValueError) as info:
        MoeConfig(backend="resident", cpu_activations="bf16")
    assert str(info.value) == ("--moe-cpu-activations bf16 needs host expert banks: use "
                               "--moe-backend cpu or hybrid")
    assert MoeConfig(backend="hybrid", cpu_activations="bf16")
    # A checkpoint whose experts are stored in fp32 (computed in fp32) gets fp32 banks.
    monkeypatch.setattr(loading, "bank_dtype", lambda *_: torch.float32)
    with pytest.raises(ValueError) as info:
        load_model(tiny_checkpoint("qwen3_moe"), moe=MoeConfig(backend="cpu",
                                                               cpu_activations="bf16"))
    assert str(info.value) == ("--moe-cpu-activations bf16 needs bf16 or fp8 host expert banks, "
                               "but this checkpoint's experts load as float32: use "
                               "--moe-cpu-activations fp32")


def test_cli_refuses_bf16_with_4bit_banks_in_one_line(tmp_path: Path, capsys):
    (tmp_path / "config.json").write_text("{}")  # never loaded: the flags fail first
    args = build_parser().parse_args(["serve", "--model", str(tmp_path), "--port", "0",
                                      "--moe-backend", "cpu", "--moe-expert-format", "mxfp4",
                                      "--moe-cpu-activations", "bf16"])
    assert serve(args) == 2
    assert capsys.readouterr().out == (
        "[freetoken] error: --moe-cpu-activations bf16 needs bf16 host expert banks: use "
        "--moe-expert-format dense (got mxfp4)\n")
