"""Resident experts kept in a kernel format on a CPU device (``freetoken.offload.resident``):
gpt-oss's MXFP4 release stays MXFP4 under ``resident`` / ``auto`` (the released bytes, the fused
decode block and the decode stack reading them), long prefill chunks over dense copies, q8
activations there, the memory check in the stored format, and the refusals off the CPU."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from freetoken.core import ResidentExperts
from freetoken.models import registry
from freetoken.models.decode_stack import build_decode_stack
from freetoken.models.moe_forward import grouped_swiglu
from freetoken.models.registry import load_model
from freetoken.offload import resident
from freetoken.offload.backend import MoeConfig, check_resident_device, resolve_cpu_activations
from freetoken.offload.banks import ExpertBanks
from freetoken.offload.resident import BankExperts
from freetoken.ops.cpu_moe.cpu import cpu_moe_banks
from tests.models.conftest import load_hf, prompt_ids


@pytest.mark.parametrize("moe", [None, MoeConfig(), MoeConfig(backend="resident")],
                         ids=["no-moe-config", "auto", "resident"])
def test_mxfp4_release_stays_mxfp4_when_resident_on_cpu(tiny_checkpoint, moe) -> None:
    """The released blocks and scales are the resident banks' bytes (gate_up rows
    de-interleaved), no dense expert tensor exists, and the decode stack takes the model."""
    path = tiny_checkpoint("gpt_oss")
    model = load_model(path, moe=moe)
    assert model.moe_runtime is None
    block = model.moe_blocks()[2]
    assert isinstance(block.experts, BankExperts)
    banks = block.experts.banks
    assert banks.format == "mxfp4" and banks.gate_up is None and banks.down is None
    stored = load_file(path / "model.safetensors")
    p = "model.layers.2.mlp.experts."
    order = torch.cat([torch.arange(0, 256, 2), torch.arange(1, 256, 2)])
    assert torch.equal(banks.view.gate_up[0], stored[p + "gate_up_proj_blocks"][:, order])
    assert torch.equal(banks.view.gate_up[1], stored[p + "gate_up_proj_scales"][:, order])
    assert torch.equal(banks.view.down[0], stored[p + "down_proj_blocks"])
    assert torch.equal(banks.gate_up_bias, stored[p + "gate_up_proj_bias"][:, order].float())
    # 17 bytes per 32 values (codes + E8M0 scale), a quarter of bf16's 64 plus the scales
    assert banks.nbytes == 16 * 3 * 256 * 128 * 17 // 32
    stack = build_decode_stack(model)
    assert stack is not None


def test_q8_activations_run_in_the_resident_banks_and_the_stack(tiny_checkpoint) -> None:
    """``--moe-expert-format mxfp4 --moe-cpu-activations q8``: the experts' activations are int8
    blocks in the torch path and the stack alike; logits move from the fp32 ones, a little."""
    path = tiny_checkpoint("gpt_oss")
    exact = load_model(path)
    q8 = load_model(path, moe=MoeConfig(backend="resident", expert_format="mxfp4",
                                        cpu_activations="q8"))
    assert q8.moe_blocks()[0].experts.activations == "q8"
    ids = prompt_ids(path, 40)
    ref = exact(ids, exact.new_state(), all_logits=True)
    out = q8(ids, q8.new_state(), all_logits=True)
    error = ((out - ref).norm() / ref.norm()).item()
    assert 0 < error <= 0.05, error
    probe = torch.zeros(1, exact.config.hidden_size)
    spec = q8.moe_blocks()[0].block_kwargs(probe)
    assert spec["activations"] == "q8" and spec["expert_format"] == "mxfp4"


def test_memory_check_counts_the_stored_format(tiny_checkpoint, monkeypatch) -> None:
    path = tiny_checkpoint("gpt_oss")
    monkeypatch.setattr(registry, "available_host_memory", lambda: 2**20)
    with pytest.raises(ValueError) as err:
        load_model(path)
    # 4 MoE layers x 16 experts x 3 x 256 x 128 values at 17 bytes per 32
    assert "(routed experts 3.19 MiB in mxfp4, other weights " in str(err.value)


def test_kernel_formats_off_the_cpu_are_refused() -> None:
    cuda = torch.device("cuda:0")
    with pytest.raises(ValueError) as err:
        check_resident_device(MoeConfig(backend="resident", expert_format="q4g"), cuda)
    assert str(err.value) == ("--moe-expert-format q4g needs host expert banks on cuda:0: use "
                              "--moe-backend offload, cpu or hybrid")
    with pytest.raises(ValueError) as err:
        check_resident_device(MoeConfig(backend="resident", expert_format="mxfp4",
                                        cpu_activations="q8"), cuda)
    assert "needs host expert banks on cuda:0" in str(err.value)
    assert check_resident_device(MoeConfig(backend="resident", expert_format="q4g"),
                                 torch.device("cpu")) is None


def test_resident_expert_format_other_than_the_stored_one_is_refused(tiny_checkpoint) -> None:
    with pytest.raises(ValueError) as err:
        load_model(tiny_checkpoint("gpt_oss"), moe=MoeConfig(backend="resident",
                                                             expert_format="q4g"))
    assert str(err.value) == ("--moe-expert-format q4g: this checkpoint's experts are MXFP4 and "
                              "stay so (use mxfp4, or dense: as stored)")


def _layer_banks(swiglu, seed: int) -> ExpertBanks:
    g = torch.Generator().manual_seed(seed)
    banks = ExpertBanks(1, 16, 64, 32, torch.bfloat16, swiglu=swiglu)
    banks.gate_up.copy_(torch.randn(16, 64, 64, generator=g) / 8)
    banks.down.copy_(torch.randn(16, 64, 32, generator=g) / 6)
    if swiglu is not None:
        banks.gate_up_bias.copy_(torch.randn(16, 64, generator=g))
        banks.down_bias.copy_(torch.randn(16, 64, generator=g))
    banks.quantize("mxfp4")
    return banks


@pytest.mark.parametrize("swiglu", [None, (7.0, 1.702)], ids=["silu", "gpt-oss"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_long_prefill_runs_dense_copies_of_the_mxfp4_experts(swiglu, dtype, monkeypatch):
    """Past DENSE_PREFILL_ROWS entries per expert the MXFP4 experts run as dense copies: bit for
    bit the dense resident experts' result (the same values, the same matmuls); in chunks of a
    few experts (a small scratch) the same up to the order of the per-chunk sums; below it, the
    expert kernel."""
    experts = BankExperts(_layer_banks(swiglu, seed=3))
    g = torch.Generator().manual_seed(4)
    t = resident.DENSE_PREFILL_ROWS * 16 // 4 + 9  # just past the threshold at top-4
    x = torch.randn(t, 64, generator=g).to(dtype)
    ids = torch.stack([torch.randperm(16, generator=g)[:4] for _ in range(t)])
    weights = torch.rand(t, 4, generator=g).to(dtype)
    gate_up, down = (w.to(dtype) for w in experts.banks.kernel_view().dequantize())
    act = experts.banks.activation()
    want = grouped_swiglu(x, ids, weights, gate_up, down, act)
    assert torch.equal(experts(x, ids, weights), want)
    monkeypatch.setattr(resident, "SCRATCH_BYTES", 3 * 64 * 32 * dtype.itemsize * 3)
    chunked = experts(x, ids, weights)  # six chunks of three experts (the last one of one)
    tolerance = 1e-6 if dtype == torch.float32 else 1e-2
    assert ((chunked.float() - want.float()).norm() / want.float().norm()).item() <= tolerance
    short = experts(x[:8], ids[:8], weights[:8])  # below the threshold: the expert kernel
    tokens = torch.arange(8).repeat_interleave(4)
    kernel = cpu_moe_banks(x[:8].contiguous(), tokens, ids[:8].flatten(),
                           weights[:8].flatten().float(), experts.banks.kernel_view(),
                           **(act.kernel_args() if act is not None else {}))
    assert torch.equal(short, kernel.to(dtype))


def test_q8_activations_keep_the_kernel_for_long_prefill(monkeypatch):
    experts = BankExperts(_layer_banks(None, seed=5), activations="q8")
    monkeypatch.setattr(resident, "dequantize_experts", None)  # would raise if called
    t = resident.DENSE_PREFILL_ROWS * 16 // 4 + 9
    ids = torch.stack([torch.randperm(16)[:4] for _ in range(t)])
    out = experts(torch.randn(t, 64), ids, torch.rand(t, 4))
    assert out.shape == (t, 64) and torch.isfinite(out).all()


@pytest.mark.parametrize("length", [40, 97])
def test_resident_mxfp4_matches_transformers_on_both_prefill_paths(tiny_checkpoint,
                                                                   length) -> None:
    """fp32 logits of the released MXFP4 checkpoint, resident as MXFP4 banks, against
    transformers' own dequantisation: 40 tokens run the expert kernel, 97 the dense copies."""
    path = tiny_checkpoint("gpt_oss")
    ft = load_model(path)
    k, e = ft.config.num_experts_per_tok, ft.config.num_experts
    assert (length * k > resident.DENSE_PREFILL_ROWS * e) == (length == 97)
    ids = prompt_ids(path, length)
    with torch.no_grad():
        ref = load_hf(path)(ids[None]).logits[0]
    assert (ft(ids, ft.new_state(), all_logits=True) - ref).abs().max().item() <= 1e-4


def test_auto_activations_are_q8_for_4bit_experts_in_a_bf16_model(tiny_checkpoint) -> None:
    """``--moe-cpu-activations auto`` (the default): int8 activation blocks for 4-bit experts
    in a bf16 model, as llama.cpp multiplies the same weights; bf16 ones for fp8 experts in a
    bf16 model; fp32 everywhere else."""
    assert resolve_cpu_activations("auto", "mxfp4", torch.bfloat16) == "q8"
    assert resolve_cpu_activations("auto", "q4g", torch.bfloat16) == "q8"
    assert resolve_cpu_activations("auto", "fp8", torch.bfloat16) == "bf16"
    assert resolve_cpu_activations("auto", "mxfp4", torch.float32) == "fp32"
    assert resolve_cpu_activations("auto", "fp8", torch.float32) == "fp32"
    for fmt in ("dense", "nvfp4"):
        assert resolve_cpu_activations("auto", fmt, torch.bfloat16) == "fp32"
    assert resolve_cpu_activations("fp32", "mxfp4", torch.bfloat16) == "fp32"
    path = tiny_checkpoint("gpt_oss")
    assert load_model(path, dtype=torch.bfloat16).moe_blocks()[0].experts.activations == "q8"
    assert load_model(path).moe_blocks()[0].experts.activations == "fp32"
    exact = load_model(path, dtype=torch.bfloat16, moe=MoeConfig(cpu_activations="fp32"))
    assert exact.moe_blocks()[0].experts.activations == "fp32"
    offloaded = load_model(path, dtype=torch.bfloat16, moe=MoeConfig(backend="cpu", cache="4"))
    assert offloaded.moe_runtime.cpu.activations == "q8"


def test_resident_experts_summary(tiny_checkpoint) -> None:
    """What ``GET /v1/freetoken/memory`` reports for resident bank experts (none for dense
    ones)."""
    summary = resident.resident_experts(load_model(tiny_checkpoint("gpt_oss"),
                                                   dtype=torch.bfloat16))
    assert summary == ResidentExperts("mxfp4", 4 * 16 * 3 * 256 * 128 * 17 // 32, "q8")
    assert resident.resident_experts(load_model(tiny_checkpoint("qwen3_moe"))) is None
