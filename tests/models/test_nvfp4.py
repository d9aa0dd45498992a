"""NVIDIA ModelOpt NVFP4 checkpoints: dequantised as read when resident, as stored in NVFP4 host
banks when offloaded; against transformers on the same weights dequantised by the format's
formula (transformers 5.24 loads no pre-quantised NVFP4 checkpoint on CPU)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from freetoken.models.registry import load_model
from freetoken.models.tiny import make_tiny
from freetoken.offload.backend import MoeConfig
from tests.models.conftest import load_hf, prompt_ids

ARCHES = ("qwen3_moe", "qwen3_next", "qwen3_5_moe", "glm4_moe")
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _dequantized(packed: torch.Tensor, scale: torch.Tensor, global_: torch.Tensor) -> torch.Tensor:
    """The ModelOpt formula, written out: code -> e2m1 (bit 3 the sign), low nibble first,
    times (e4m3 block scale * global) per 16 columns."""
    lut = torch.tensor(E2M1 + tuple(-v for v in E2M1))
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2).long()
    block = scale.float() * global_.float()
    return lut[codes] * block.repeat_interleave(16, dim=-1)


@pytest.fixture(scope="module", params=ARCHES)
def pair(request, tmp_path_factory):
    """(the NVFP4 checkpoint, its fp32 twin without quantisation) of one family."""
    root = tmp_path_factory.mktemp(f"nvfp4-{request.param}")
    path = make_tiny(request.param, "tiny", root / "nvfp4", weights="nvfp4")
    twin = root / "twin"
    shutil.copytree(path, twin)
    (twin / "hf_quant_config.json").unlink()
    tensors = load_file(path / "model.safetensors")
    out = {}
    for name, t in tensors.items():
        if name.endswith((".weight_scale", ".weight_scale_2", ".input_scale")):
            continue
        if name + "_scale" in tensors:
            t = _dequantized(t, tensors[name + "_scale"], tensors[name + "_scale_2"])
        out[name] = t
    save_file(out, str(twin / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((twin / "config.json").read_text())
    config.pop("quantization_config")
    (twin / "config.json").write_text(json.dumps(config))
    return request.param, path, twin


def test_released_layout(pair) -> None:
    arch, path, _ = pair
    tensors = load_file(path / "model.safetensors")
    pre = "model.language_model." if arch == "qwen3_5_moe" else "model."
    gate = pre + "layers.1.mlp.experts.3.gate_proj."
    assert tensors[gate + "weight"].dtype == torch.uint8
    assert tensors[gate + "weight"].shape == (128, 128)  # [I, H/2]
    assert tensors[gate + "weight_scale"].dtype == torch.float8_e4m3fn
    assert tensors[gate + "weight_scale"].shape == (128, 16)  # [I, H/16]
    assert tensors[gate + "weight_scale_2"].shape == () and tensors[gate + "input_scale"].shape == ()
    assert tensors["lm_head.weight"].dtype == torch.bfloat16
    quant = json.loads((path / "config.json").read_text())["quantization_config"]
    assert (quant["quant_method"], quant["quant_algo"], quant["group_size"]) == (
        "modelopt", "NVFP4", 16)
    assert "lm_head" in quant["ignore"]


@pytest.mark.parametrize("length", [1, 19, 70])
def test_resident_logits_match_transformers_on_the_dequantised_twin(pair, length) -> None:
    _, path, twin = pair
    ft = load_model(path)
    ids = prompt_ids(path, length)
    with torch.no_grad():
        ref = load_hf(twin)(ids[None]).logits[0]
    assert (ft(ids, ft.new_state(), all_logits=True) - ref).abs().max().item() <= 1e-4


@pytest.mark.parametrize("backend", ["offload", "cpu", "hybrid"])
def test_nvfp4_banks_hold_the_stored_bytes_and_match_resident(pair, backend) -> None:
    arch, path, _ = pair
    base = load_model(path)
    model = load_model(path, moe=MoeConfig(backend=backend, cache="4"))
    banks = model.moe_runtime.banks
    assert banks.format == "nvfp4" and banks.gate_up is None
    tensors = load_file(path / "model.safetensors")
    pre = "model.language_model." if arch == "qwen3_5_moe" else "model."
    first = next(i for i in range(4) if base.config.is_moe_layer(i))
    up = f"{pre}layers.{first}.mlp.experts.5.up_proj."
    i = base.config.moe_intermediate_size
    assert torch.equal(banks.view.gate_up[0][5, i:], tensors[up + "weight"])
    assert torch.equal(banks.view.gate_up[1][5, i:].view(torch.uint8),
                       tensors[up + "weight_scale"].view(torch.uint8))
    assert torch.equal(banks.view.gate_up[2][5, i:],
                       tensors[up + "weight_scale_2"].expand(i))
    ids = prompt_ids(path, 30)
    ref = base(ids, base.new_state(), all_logits=True)
    out = model(ids, model.new_state(), all_logits=True)
    assert (out - ref).abs().max().item() <= 1e-5 * ref.abs().max().item()


def test_an_export_with_only_hf_quant_config_loads_the_same(pair, tmp_path) -> None:
    """Older ModelOpt exports keep the settings in hf_quant_config.json only."""
    _, path, _ = pair
    dst = tmp_path / "older"
    shutil.copytree(path, dst)
    config = json.loads((dst / "config.json").read_text())
    config.pop("quantization_config")
    (dst / "config.json").write_text(json.dumps(config))
    ids = prompt_ids(path, 12)
    a, b = load_model(path), load_model(dst)
    assert torch.equal(a(ids, a.new_state()), b(ids, b.new_state()))


def _without(path, dst, drop: str) -> None:
    shutil.copytree(path, dst)
    tensors = load_file(dst / "model.safetensors")
    del tensors[drop]
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("part", ["weight_scale", "weight_scale_2"])
@pytest.mark.parametrize("moe", [None, MoeConfig(backend="cpu")], ids=["resident", "cpu"])
def test_a_missing_scale_is_named_on_every_backend(pair, tmp_path, part, moe) -> None:
    arch, path, _ = pair
    pre = "model.language_model." if arch == "qwen3_5_moe" else "model."
    weight = f"{pre}layers.1.mlp.experts.2.down_proj.weight"
    _without(path, tmp_path / "bad", f"{weight}{part[len('weight'):]}")
    with pytest.raises(ValueError) as err:
        load_model(tmp_path / "bad", moe=moe)
    assert str(err.value) == (f"checkpoint {tmp_path / 'bad'}: NVFP4 weight {weight!r} has no "
                              f"'{weight}{part[len('weight'):]}'")


def test_nvfp4_tensors_without_a_declaration_are_named(pair, tmp_path) -> None:
    _, path, _ = pair
    dst = tmp_path / "undeclared"
    shutil.copytree(path, dst)
    (dst / "hf_quant_config.json").unlink()
    config = json.loads((dst / "config.json").read_text())
    config.pop("quantization_config")
    (dst / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="looks like an NVFP4 \\(ModelOpt\\) scale, but neither "
                                         "config.json's quantization_config nor "
                                         "hf_quant_config.json declares NVFP4"):
        load_model(dst)
