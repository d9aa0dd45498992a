"""FP8 block-quantised checkpoints (the official -FP8 release layout): dequantised as read when
resident, against transformers' own dequantisation of the same files; through every MoE backend,
the routed experts kept FP8 in the host banks."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from freetoken.models.loader import Checkpoint, dequantize_blocks
from freetoken.models.registry import load_model
from freetoken.models.tiny import make_tiny
from freetoken.models.tiny_fp8 import FP8, quantize_blocks
from freetoken.offload.backend import MoeConfig
from tests.models.conftest import load_hf, prompt_ids

ARCHES = ("qwen3_5_moe", "glm4_moe")


@pytest.fixture(scope="module", params=ARCHES)
def fp8(request, tmp_path_factory):
    return make_tiny(request.param, "tiny", tmp_path_factory.mktemp("fp8") / request.param,
                     weights="fp8")


def test_logits_match_transformers_dequantisation(fp8) -> None:
    ft, hf = load_model(fp8), load_hf(fp8)
    ids = prompt_ids(fp8, 48)
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    state = ft.new_state()
    assert (ft(ids, state, all_logits=True) - ref).abs().max().item() <= 1e-4
    full = torch.cat([ids, torch.tensor([7, 99, 512])])
    with torch.no_grad():
        ref_next = hf(full[None]).logits[0, -3:]
    steps = [ft(full[i : i + 1], state)[0] for i in range(48, 51)]
    assert (torch.stack(steps) - ref_next).abs().max().item() <= 1e-4


@pytest.mark.parametrize("backend", ["offload", "cpu", "hybrid"])
def test_every_backend_generates_the_resident_tokens(fp8, backend) -> None:
    def greedy(model):
        state, out = model.new_state(), []
        logits = model(prompt_ids(fp8, 24), state)
        for _ in range(12):
            out.append(int(logits.argmax()))
            logits = model(torch.tensor(out[-1:]), state)
        return out

    offloaded = load_model(fp8, moe=MoeConfig(backend=backend, cache="2"))
    assert offloaded.moe_runtime is not None
    assert greedy(offloaded) == greedy(load_model(fp8))


def test_offloaded_experts_stay_fp8_in_the_host_banks(fp8) -> None:
    """The per-expert e4m3 values and block scales are the banks' bytes (gate rows' blocks
    first, then up's); the CPU kernel reads them there."""
    banks = load_model(fp8, moe=MoeConfig(backend="cpu")).moe_runtime.banks
    assert banks.format == "fp8" and banks.gate_up is None and banks.view.block_size == (128, 128)
    tensors = load_file(fp8 / "model.safetensors")
    pre = "model.language_model." if "text_config" in json.loads(
        (fp8 / "config.json").read_text()) else "model."
    layer = next(i for i in range(4) if f"{pre}layers.{i}.mlp.experts.0.up_proj.weight" in tensors)
    moe_layer = 0 if pre != "model." or layer == 0 else layer - 1  # GLM: layer 0 is dense
    n = moe_layer * 16 + 6
    up = f"{pre}layers.{layer}.mlp.experts.6.up_proj."
    values, scales = banks.view.gate_up
    assert torch.equal(values[n, 128:].view(torch.uint8), tensors[up + "weight"].view(torch.uint8))
    assert torch.equal(scales[n, 1:], tensors[up + "weight_scale_inv"])


def test_block_dequantisation_is_values_times_block_scales() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(256, 384, generator=g)
    values, scales = quantize_blocks(w, (128, 128))
    assert values.dtype == FP8 and scales.shape == (2, 3)
    want = values.float() * scales.repeat_interleave(128, 0).repeat_interleave(128, 1)
    assert torch.equal(dequantize_blocks(values, scales), want)
    assert (dequantize_blocks(values, scales) - w).abs().max() <= w.abs().max() / 8
    with pytest.raises(ValueError, match=r"weight \[256, 384\] is not divisible by its scale grid"):
        dequantize_blocks(values, torch.ones(3, 3))


def test_fused_fp8_experts_read_one_expert_slice(tiny_checkpoint, tmp_path) -> None:
    """A fused ``experts.gate_up_proj`` in FP8 with an ``[E, 2I/bm, H/bn]`` scale grid: each
    expert's gate / up half is its own rows and scale rows."""
    src = tiny_checkpoint("qwen3_5_moe")
    dst = tmp_path / "fused-fp8"
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    name = "model.language_model.layers.1.mlp.experts.gate_up_proj"
    values, scales = quantize_blocks(tensors[name], (128, 128))  # [16, 256, 256] -> [16, 2, 2]
    tensors[name], tensors[name + "_scale_inv"] = values, scales
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    checkpoint = Checkpoint(dst)
    assert checkpoint.dtype("model.layers.1.mlp.experts.3.up_proj.weight") == "F8_E4M3"
    model = load_model(dst)
    gate_up = model.layers[1].mlp.experts.gate_up[3]
    assert torch.equal(gate_up[128:], dequantize_blocks(values[3, 128:], scales[3, 1:]))
    assert torch.equal(gate_up[:128], dequantize_blocks(values[3, :128], scales[3, :1]))


def test_fp8_tensor_without_its_scale_is_refused(fp8, tmp_path) -> None:
    dst = tmp_path / "no-scale"
    shutil.copytree(fp8, dst)
    tensors = load_file(dst / "model.safetensors")
    scale = next(n for n in tensors if n.endswith("o_proj.weight_scale_inv"))
    del tensors[scale]
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError) as err:
        load_model(dst)
    weight = scale[: -len("_scale_inv")]
    assert str(err.value) == (f"checkpoint {dst}: FP8 tensor {weight!r} has no "
                              f"{weight + '_scale_inv'!r}")
