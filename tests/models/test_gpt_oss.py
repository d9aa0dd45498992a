"""gpt-oss beyond the shared parity tests: both released expert layouts against transformers,
YaRN against transformers' own frequencies, sliding windows past the window, and refusals."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from freetoken.models.config import ModelConfig
from freetoken.models.config_gpt_oss import DEFAULT_YARN, _yarn
from freetoken.models.registry import load_model
from freetoken.models.rotary import yarn_inv_freq
from freetoken.models.tiny import make_tiny
from freetoken.offload.backend import MoeConfig
from tests.models.conftest import load_hf, prompt_ids


@pytest.fixture(scope="module")
def bf16_layout(tmp_path_factory) -> object:
    return make_tiny("gpt_oss", "tiny", tmp_path_factory.mktemp("oss") / "bf16",
                     expert_format="bf16")


def _stored(path) -> dict[str, tuple[str, list[int]]]:
    with safe_open(path / "model.safetensors", framework="pt") as f:
        return {n: (f.get_slice(n).get_dtype(), f.get_slice(n).get_shape()) for n in f.keys()}


def test_released_tensor_names_dtypes_and_shapes(tiny_checkpoint, bf16_layout) -> None:
    mx, bf = _stored(tiny_checkpoint("gpt_oss")), _stored(bf16_layout)
    p = "model.layers.0.mlp.experts."
    assert mx[p + "gate_up_proj_blocks"] == ("U8", [16, 256, 8, 16])
    assert mx[p + "gate_up_proj_scales"] == ("U8", [16, 256, 8])
    assert mx[p + "down_proj_blocks"] == ("U8", [16, 256, 4, 16])
    assert mx[p + "down_proj_scales"] == ("U8", [16, 256, 4])
    assert bf[p + "gate_up_proj"] == ("BF16", [16, 256, 256])  # [E, H, 2I], [in, out]
    assert bf[p + "down_proj"] == ("BF16", [16, 128, 256])  # [E, I, H]
    for stored in (mx, bf):
        assert stored[p + "gate_up_proj_bias"] == ("BF16", [16, 256])
        assert stored["model.layers.0.self_attn.sinks"] == ("BF16", [4])
        assert stored["model.layers.0.self_attn.o_proj.bias"] == ("BF16", [256])
        assert stored["model.layers.0.mlp.router.bias"] == ("BF16", [16])
    assert set(mx) - set(bf) == {p.replace("0", str(i)) + f"{w}_{k}" for i in range(4)
                                 for w in ("gate_up_proj", "down_proj")
                                 for k in ("blocks", "scales")}
    config = json.loads((tiny_checkpoint("gpt_oss") / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "mxfp4"
    assert "quantization_config" not in json.loads((bf16_layout / "config.json").read_text())
    assert config["layer_types"] == ["sliding_attention", "full_attention"] * 2


def test_transformers_loads_both_layouts_with_no_missing_keys(tiny_checkpoint,
                                                              bf16_layout) -> None:
    from transformers import AutoModelForCausalLM

    for path in (tiny_checkpoint("gpt_oss"), bf16_layout):
        _, info = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                       output_loading_info=True)
        assert not any(info.values()), info


@pytest.mark.parametrize("length", [1, 31, 33, 97])
def test_bf16_layout_matches_transformers(bf16_layout, length) -> None:
    """Prompts shorter and longer than the 32-key window of the tiny preset."""
    ft = load_model(bf16_layout)
    ids = prompt_ids(bf16_layout, length)
    with torch.no_grad():
        ref = load_hf(bf16_layout)(ids[None]).logits[0]
    assert (ft(ids, ft.new_state(), all_logits=True) - ref).abs().max().item() <= 1e-4


def test_both_layouts_hold_the_same_weights_up_to_mxfp4(tiny_checkpoint, bf16_layout) -> None:
    """The MXFP4 file is the bf16 one quantised: same non-expert tensors, bit for bit."""
    mx, bf = load_file(tiny_checkpoint("gpt_oss") / "model.safetensors"), load_file(
        bf16_layout / "model.safetensors")
    for name, tensor in bf.items():
        if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            assert torch.equal(tensor, mx[name]), name


@pytest.mark.parametrize("params", [
    DEFAULT_YARN,
    {"rope_type": "yarn", "factor": 8.0, "beta_fast": 16.0, "beta_slow": 2.0,
     "original_max_position_embeddings": 2048, "truncate": True},
])
def test_yarn_frequencies_and_scale_equal_transformers(params) -> None:
    from transformers import GptOssConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = GptOssConfig(head_dim=64, hidden_size=256, num_attention_heads=4,
                      rope_parameters={**params, "rope_theta": 150000.0})
    inv_freq, factor = ROPE_INIT_FUNCTIONS["yarn"](hf)
    yarn = _yarn(params)
    assert torch.equal(yarn_inv_freq(64, 150000.0, yarn), inv_freq)
    assert yarn.attention_factor == factor


def test_mxfp4_experts_fill_the_host_banks_as_stored(tiny_checkpoint) -> None:
    """The released blocks and scales are the MXFP4 banks' bytes (gate_up rows de-interleaved,
    codes and scales alike); no dense bank exists; the fp32 biases sit beside them."""
    path = tiny_checkpoint("gpt_oss")
    model = load_model(path, moe=MoeConfig(backend="cpu"))
    banks = model.moe_runtime.banks
    assert banks.format == "mxfp4" and banks.gate_up is None and banks.down is None
    stored = load_file(path / "model.safetensors")
    p = "model.layers.2.mlp.experts."
    order = torch.cat([torch.arange(0, 256, 2), torch.arange(1, 256, 2)])
    flat = slice(2 * 16, 3 * 16)  # MoE layer 2's rows of the banks
    assert torch.equal(banks.view.gate_up[0][flat], stored[p + "gate_up_proj_blocks"][:, order])
    assert torch.equal(banks.view.gate_up[1][flat], stored[p + "gate_up_proj_scales"][:, order])
    assert torch.equal(banks.view.down[0][flat], stored[p + "down_proj_blocks"])
    assert torch.equal(banks.view.down[1][flat], stored[p + "down_proj_scales"])
    assert torch.equal(banks.gate_up_bias[flat], stored[p + "gate_up_proj_bias"][:, order].float())
    assert torch.equal(banks.down_bias[flat], stored[p + "down_proj_bias"].float())


@pytest.mark.parametrize("backend", ["offload", "cpu", "hybrid"])
def test_offloaded_bf16_layout_matches_resident(bf16_layout, backend) -> None:
    ids = prompt_ids(bf16_layout, 40)
    base = load_model(bf16_layout)
    offloaded = load_model(bf16_layout, moe=MoeConfig(backend=backend, cache="4"))
    assert offloaded.moe_runtime.banks.format == "dense"
    ref = base(ids, base.new_state(), all_logits=True)
    out = offloaded(ids, offloaded.new_state(), all_logits=True)
    assert (out - ref).abs().max().item() <= 1e-5 * ref.abs().max().item()


@pytest.mark.parametrize("moe, message", [
    (MoeConfig(backend="cpu", cpu_activations="bf16"),
     "--moe-cpu-activations bf16 needs bf16 or fp8 host expert banks, but this checkpoint's "
     "experts load as mxfp4: use --moe-cpu-activations fp32"),
    (MoeConfig(backend="cpu", expert_format="q4g"),
     "--moe-expert-format q4g: this checkpoint's experts are MXFP4 and stay so in the host "
     "banks (use mxfp4, or dense: as stored)"),
])
def test_mxfp4_bank_options_that_cannot_apply_are_refused(tiny_checkpoint, moe, message) -> None:
    with pytest.raises(ValueError) as err:
        load_model(tiny_checkpoint("gpt_oss"), moe=moe)
    assert str(err.value) == message


@pytest.mark.parametrize("change, message", [
    ({"quantization_config": {"quant_method": "fp8"}},
     "config.json: quantised gpt_oss checkpoints (quant_method 'fp8') are not served (served: "
     "the released 'mxfp4' experts, or bf16)"),
    ({"layer_types": ["sliding_attention"] * 3},
     "config.json: 'layer_types' must be a list of 4 entries from sliding_attention, "
     "full_attention"),
    ({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}},
     "config.json: rope_type 'longrope' is unsupported for gpt_oss (served: yarn, default)"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 32.0}},
     "config.json: yarn 'original_max_position_embeddings' must be a positive integer, got None"),
    ({"swiglu_limit": -1}, "config.json: 'swiglu_limit' must be a positive number, got -1"),
])
def test_bad_configs_are_refused(tiny_checkpoint, change, message) -> None:
    raw = json.loads((tiny_checkpoint("gpt_oss") / "config.json").read_text())
    with pytest.raises(ValueError) as err:
        ModelConfig.from_hf(dict(raw, **change))
    assert str(err.value) == message


def test_mismatched_mxfp4_scales_are_refused(tiny_checkpoint, tmp_path) -> None:
    dst = tmp_path / "bad"
    shutil.copytree(tiny_checkpoint("gpt_oss"), dst)
    tensors = load_file(dst / "model.safetensors")
    name = "model.layers.1.mlp.experts.down_proj_scales"
    tensors[name] = tensors[name][:, :, :2].contiguous()
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError) as err:
        load_model(dst)
    assert str(err.value) == (
        f"checkpoint {dst}: MXFP4 tensor 'model.layers.1.mlp.experts.down_proj_blocks' "
        "[16, 256, 4, 16] needs [E, R, C/32, 16] blocks and "
        "'model.layers.1.mlp.experts.down_proj_scales' [E, R, C/32], got [16, 256, 2]")


@pytest.mark.parametrize("reload", [False, True])
def test_resized_cache_keeps_each_slots_biases(tiny_checkpoint, reload) -> None:
    path = tiny_checkpoint("gpt_oss")
    ids = prompt_ids(path, 24)
    base = load_model(path)
    model = load_model(path, moe=MoeConfig(backend="offload", cache="12"))
    cache = model.moe_runtime.cache
    ref = base(ids, base.new_state(), all_logits=True)
    out = model(ids, model.new_state(), all_logits=True)
    cache.resize(5, reload=reload)
    cache.check_invariants()  # each held slot's biases equal its bank row's
    again = model(ids, model.new_state(), all_logits=True)
    for logits in (out, again):
        assert (logits - ref).abs().max().item() <= 1e-5 * ref.abs().max().item()
