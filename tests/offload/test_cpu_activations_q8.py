"""``--moe-cpu-activations q8`` end to end: the tiny qwen3_next with q4g host banks and every miss
on the CPU kernel, int8 activations against fp32 ones, and the refusals of bad combinations.

Bound: over a 12-token prefill and 15 teacher-forced decode steps, the relative RMS of the
logits of the q8 run against the fp32-activation run stays <= LOGITS_BOUND = 2e-3 at every
step (measured: 1e-4 to 2e-4; the routed experts are one term of the residual stream, so the
per-layer Q8_TOLERANCE of ~1e-2 shrinks by the time it reaches the logits). Greedy tokens are
not required to be identical.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from freetoken.cli import build_parser
from freetoken.launch import serve
from freetoken.models.registry import load_model
from freetoken.offload.backend import MoeConfig
from freetoken.ops.cpu_moe import relative_rms_error

PROMPT = torch.tensor([5, 17, 300, 42, 8000, 12, 99, 1000, 7, 7, 2048, 31], dtype=torch.long)
STEPS = 16
LOGITS_BOUND = 2e-3


def _logits(model, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Logits of each step's inputs (prefill, then one token per step) on a fresh state."""
    runtime, state, out = model.moe_runtime, model.new_state(), []
    for ids in inputs:
        runtime.begin_step()
        out.append(model(ids, state).float())
        runtime.end_step()
    return out


def teacher_forced_errors(ref_model, model) -> list[float]:
    """Per-step relative RMS of ``model``'s logits against ``ref_model``'s, both fed the prompt
    and then ``ref_model``'s greedy tokens (teacher forcing), STEPS steps."""
    runtime = ref_model.moe_runtime
    state, inputs = ref_model.new_state(), [PROMPT]
    for _ in range(STEPS - 1):
        runtime.begin_step()
        token = int(ref_model(inputs[-1], state)[-1].argmax())
        runtime.end_step()
        inputs.append(torch.tensor([token]))
    ref, got = _logits(ref_model, inputs), _logits(model, inputs)
    return [relative_rms_error(a, b) for a, b in zip(ref, got)]


def test_q8_logits_stay_close_to_fp32_activations(tiny_checkpoint):
    path = tiny_checkpoint("qwen3_next")
    models = {act: load_model(path, moe=MoeConfig(backend="cpu", cache="1", expert_format="q4g",
                                                  cpu_activations=act))
              for act in ("fp32", "q8")}
    assert models["q8"].moe_runtime.cpu.activations == "q8"
    errors = teacher_forced_errors(models["fp32"], models["q8"])
    assert all(0 < e <= LOGITS_BOUND for e in errors), errors  # > 0: the q8 path really ran
    stats = models["q8"].moe_runtime.stats()
    assert sum(layer.cpu_experts for layer in stats.layers) > 0


def test_q8_with_dense_banks_is_refused():
    message = ("--moe-cpu-activations q8 needs 4-bit host expert banks: use --moe-expert-format "
               "mxfp4 or q4g (got dense)")
    with pytest.raises(ValueError) as info:
        MoeConfig(backend="cpu", cpu_activations="q8")
    assert str(info.value) == message
    with pytest.raises(ValueError) as info:
        MoeConfig(backend="cpu", expert_format="mxfp4", cpu_activations="int8")
    assert str(info.value) == "unknown --moe-cpu-activations 'int8'; choose one of auto, fp32, q8, bf16"
    assert MoeConfig(backend="hybrid", expert_format="mxfp4", cpu_activations="q8")


def test_cli_refuses_q8_with_dense_banks_in_one_line(tmp_path: Path, capsys):
    (tmp_path / "config.json").write_text("{}")  # never loaded: the flags fail first
    args = build_parser().parse_args(["serve", "--model", str(tmp_path), "--port", "0",
                                      "--moe-backend", "cpu", "--moe-cpu-activations", "q8"])
    assert serve(args) == 2
    assert capsys.readouterr().out == (
        "[freetoken] error: --moe-cpu-activations q8 needs 4-bit host expert banks: use "
        "--moe-expert-format mxfp4 or q4g (got dense)\n")
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["serve", "--moe-cpu-activations", "int8"])
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().endswith(
        "freetoken serve: error: argument --moe-cpu-activations: invalid choice: 'int8' "
        "(choose from 'auto', 'fp32', 'q8', 'bf16')")
