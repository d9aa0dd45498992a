"""Qwen3.5-MoE as released: multimodal config, ``model.language_model.`` names, fused experts,
an ignored vision tower; read by the engine and by transformers from the same files."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from safetensors import safe_open

from freetoken.models.config import ModelConfig
from freetoken.models.loader import Checkpoint
from freetoken.models.registry import load_model
from tests.models.conftest import load_hf

# Keys of the real Qwen3.5-35B-A3B config (model-architectures.md §1.3) that shape the text model.
TEXT_KEYS = {
    "model_type", "vocab_size", "hidden_size", "num_hidden_layers", "layer_types",
    "full_attention_interval", "num_attention_heads", "num_key_value_heads", "head_dim",
    "attn_output_gate", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
    "linear_value_head_dim", "linear_conv_kernel_dim", "num_experts", "num_experts_per_tok",
    "moe_intermediate_size", "shared_expert_intermediate_size", "mlp_only_layers",
    "eos_token_id", "rope_parameters", "mamba_ssm_dtype", "max_position_embeddings",
    "rms_norm_eps", "hidden_act", "dtype", "router_aux_loss_coef",
}
TOP_KEYS = {"architectures", "model_type", "image_token_id", "video_token_id",
            "vision_start_token_id", "vision_end_token_id", "tie_word_embeddings", "text_config",
            "vision_config"}
P = "model.language_model.layers."


@pytest.fixture(scope="module")
def path(tiny_checkpoint):
    return tiny_checkpoint("qwen3_5_moe")


def _stored(path) -> dict[str, tuple[list[int], str]]:
    with safe_open(path / "model.safetensors", framework="pt") as f:
        return {n: (f.get_slice(n).get_shape(), f.get_slice(n).get_dtype()) for n in f.keys()}


def test_released_config_and_tensor_layout(path) -> None:
    raw = json.loads((path / "config.json").read_text())
    assert TOP_KEYS <= set(raw) and TEXT_KEYS <= set(raw["text_config"])
    assert (raw["architectures"], raw["model_type"], raw["text_config"]["model_type"]) == (
        ["Qwen3_5MoeForConditionalGeneration"], "qwen3_5_moe", "qwen3_5_moe_text")
    rope = raw["text_config"]["rope_parameters"]
    assert rope["mrope_interleaved"] is True and sum(rope["mrope_section"]) == 8
    stored = _stored(path)
    c = ModelConfig.from_file(path)
    e, i, h = c.num_experts, c.moe_intermediate_size, c.hidden_size
    assert stored[P + "0.mlp.experts.gate_up_proj"] == ([e, 2 * i, h], "BF16")
    assert stored[P + "3.mlp.experts.down_proj"] == ([e, h, i], "BF16")
    gdn = P + "0.linear_attn."
    assert stored[gdn + "in_proj_qkv.weight"][0] == [2 * 2 * 64 + 4 * 64, h]
    assert stored[gdn + "in_proj_z.weight"][0] == [4 * 64, h]
    assert stored[gdn + "in_proj_b.weight"][0] == stored[gdn + "in_proj_a.weight"][0] == [4, h]
    assert stored[gdn + "A_log"][1] == stored[gdn + "norm.weight"][1] == "F32"
    assert "lm_head.weight" in stored and "model.language_model.embed_tokens.weight" in stored
    assert not [n for n in stored if n.startswith("model.layers.") or ".experts.0." in n]
    assert "model.visual.blocks.0.attn.qkv.weight" in stored
    hf, info = load_hf_with_info(path)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
    assert type(hf).__name__ == "Qwen3_5MoeForCausalLM"


def load_hf_with_info(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                output_loading_info=True)


def test_fused_experts_load_as_exact_slices(path) -> None:
    checkpoint = Checkpoint(path)
    assert sum(n.startswith("model.visual.") for n in checkpoint.ignored) == 21
    ft = load_model(path)
    with safe_open(path / "model.safetensors", framework="pt") as f:
        fused = f.get_tensor(P + "1.mlp.experts.gate_up_proj").float()
        down = f.get_tensor(P + "1.mlp.experts.down_proj").float()
        qkv = f.get_tensor(P + "1.linear_attn.in_proj_qkv.weight").float()
        a = f.get_tensor(P + "1.linear_attn.in_proj_a.weight").float()
    experts = ft.layers[1].mlp.experts
    assert torch.equal(experts.gate_up, fused) and torch.equal(experts.down, down)
    mixer = ft.layers[1].mixer
    assert torch.equal(mixer.in_weight[: mixer.conv_dim], qkv)
    assert torch.equal(mixer.in_weight[-mixer.hv:], a)
    assert checkpoint.shape("model.layers.1.mlp.experts.5.up_proj.weight") == (128, 256)


def test_vision_tower_is_logged_and_not_loaded(path, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="freetoken.models"):
        load_model(path)
    assert "vision tower not loaded (21 tensors): serving the text model only" in caplog.text


def test_logits_match_transformers_with_the_layout_of_the_release(path) -> None:
    ft, hf = load_model(path), load_hf(path)
    ids = torch.arange(5, 5 + 3 * 37) % 8000
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    assert (ft(ids, ft.new_state(), all_logits=True) - ref).abs().max().item() <= 1e-4


def _raw(path) -> dict:
    return json.loads((path / "config.json").read_text())


@pytest.mark.parametrize("edit, message", [
    (lambda raw: raw.pop("text_config"),
     "config.json: 'text_config' must be an object for Qwen3_5MoeForConditionalGeneration"),
    (lambda raw: raw["text_config"]["rope_parameters"].update(mrope_section=[4, 4, 4]),
     "config.json: 'mrope_section' [4, 4, 4] must be non-negative integers summing to "
     "rotary_dim / 2 = 8"),
    (lambda raw: raw.update(quantization_config={"quant_method": "awq", "bits": 4}),
     "config.json: quantised checkpoints (quant_method 'awq') are not served yet (served: "
     "'fp8' block quantisation, ModelOpt NVFP4); use the bf16 release of this model"),
    (lambda raw: raw.update(quantization_config={"quant_method": "modelopt",
                                                 "quant_algo": "FP8"}),
     "config.json: ModelOpt quant_algo 'FP8' (group_size 16) is not served (served: NVFP4 "
     "with groups of 16)"),
    (lambda raw: raw.update(quantization_config={"quant_method": "fp8",
                                                 "weight_block_size": [128]}),
     "config.json: fp8 'weight_block_size' must be two positive integers, got [128]"),
    (lambda raw: raw.update(quantization_config={"quant_method": "fp8",
                                                 "weight_block_size": [128, 128],
                                                 "activation_scheme": "static"}),
     "config.json: only fp8 e4m3 weights with dynamic activation scaling are served, got fmt "
     "None, activation_scheme 'static'"),
    (lambda raw: raw.update(model_type="qwen3_next"),
     "config.json: 'model_type' is 'qwen3_next', expected 'qwen3_5_moe' for "
     "Qwen3_5MoeForConditionalGeneration"),
])
def test_bad_configs_are_refused(path, edit, message) -> None:
    raw = _raw(path)
    edit(raw)
    with pytest.raises(ValueError) as err:
        ModelConfig.from_hf(raw)
    assert str(err.value) == message


def test_text_only_config_is_the_same_model(path) -> None:
    raw = _raw(path)
    flat = dict(raw["text_config"], architectures=["Qwen3_5MoeForCausalLM"],
                tie_word_embeddings=False)
    nested = ModelConfig.from_hf(raw)
    assert ModelConfig.from_hf(flat) == nested.__class__(**{**nested.__dict__,
                                                             "arch": "Qwen3_5MoeForCausalLM"})
    assert nested.model_type == "qwen3_5_moe" and nested.norm_topk_prob
    assert nested.layer_types == ("linear_attention",) * 3 + ("full_attention",)
