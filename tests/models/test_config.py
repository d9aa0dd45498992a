"""ModelConfig.from_hf: the engine view of real-layout config.json files and its errors."""

from __future__ import annotations

import copy

import pytest

from freetoken.models.config import ModelConfig
from freetoken.models.tiny_presets import preset_config

NEXT = preset_config("qwen3_next", "tiny", 8256, 8192, 8194)
MOE = preset_config("qwen3_moe", "tiny", 8256, 8192, 8194)


def test_qwen3_next_view() -> None:
    c = ModelConfig.from_hf(NEXT)
    assert (c.arch, c.model_type, c.vocab_size, c.hidden_size) == ("Qwen3NextForCausalLM", "qwen3_next", 8256, 256)
    assert c.layer_types == ("linear_attention",) * 3 + ("full_attention",)
    assert (c.head_dim, c.rotary_dim, c.rope_theta) == (64, 16, 1e7)
    assert (c.linear_num_key_heads, c.linear_num_value_heads, c.linear_conv_kernel_dim) == (2, 4, 4)
    assert (c.num_experts, c.num_experts_per_tok, c.norm_topk_prob) == (16, 4, True)
    assert c.shared_expert_intermediate_size == 128 and c.zero_centered_norms
    assert c.intermediate_size == 0  # no dense layer
    assert c.eos_token_ids == (8194,) and c.bos_token_id == 8192
    assert c.max_position_embeddings == 262144 and c.torch_dtype == "bfloat16"


def test_qwen3_moe_view() -> None:
    c = ModelConfig.from_hf(MOE)
    assert c.layer_types == ("full_attention",) * 4
    assert (c.rotary_dim, c.partial_rotary_factor, c.zero_centered_norms) == (64, 1.0, False)
    assert c.shared_expert_intermediate_size == 0 and c.linear_num_value_heads == 0
    assert all(c.is_moe_layer(i) for i in range(4))


def test_v5_rope_parameters_and_explicit_layer_types() -> None:
    raw = copy.deepcopy(NEXT)
    for key in ("rope_theta", "partial_rotary_factor", "rope_scaling", "full_attention_interval"):
        del raw[key]
    raw["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.5}
    raw["layer_types"] = ["mamba", "attention", "linear_attention", "full_attention"]
    c = ModelConfig.from_hf(raw)
    assert (c.rope_theta, c.rotary_dim) == (5e6, 32)
    assert c.layer_types == ("linear_attention", "full_attention") * 2


def test_dense_layers_need_intermediate_size() -> None:
    raw = dict(MOE, mlp_only_layers=[2])
    c = ModelConfig.from_hf(raw)
    assert [c.is_moe_layer(i) for i in range(4)] == [True, True, False, True]
    assert c.intermediate_size == 512
    del raw["intermediate_size"]
    with pytest.raises(ValueError) as err:
        ModelConfig.from_hf(raw)
    assert str(err.value) == "config.json: missing required key 'intermediate_size'"


def _error(raw: dict) -> str:
    with pytest.raises(ValueError) as err:
        ModelConfig.from_hf(raw)
    return str(err.value)


@pytest.mark.parametrize("change, message", [
    ({"architectures": ["MixtralForCausalLM"]},
     "unsupported architecture 'MixtralForCausalLM'; supported: Glm4MoeForCausalLM, "
     "GptOssForCausalLM, Qwen3MoeForCausalLM, Qwen3NextForCausalLM, Qwen3_5MoeForCausalLM, "
     "Qwen3_5MoeForConditionalGeneration"),
    ({"architectures": []}, "config.json: 'architectures' must be a non-empty list of strings"),
    ({"model_type": "qwen3_moe"},
     "config.json: 'model_type' is 'qwen3_moe', expected 'qwen3_next' for Qwen3NextForCausalLM"),
    ({"hidden_size": None}, "config.json: missing required key 'hidden_size'"),
    ({"num_hidden_layers": "4"}, "config.json: 'num_hidden_layers' must be an integer, got '4'"),
    ({"num_key_value_heads": 3},
     "config.json: 'num_attention_heads' 4 is not a multiple of 'num_key_value_heads' 3"),
    ({"linear_num_value_heads": 3},
     "config.json: 'linear_num_value_heads' is not a multiple of 'linear_num_key_heads'"),
    ({"num_experts_per_tok": 17}, "config.json: 'num_experts_per_tok' 17 > 'num_experts' 16"),
    ({"norm_topk_prob": 1}, "config.json: 'norm_topk_prob' must be true or false, got 1"),
    ({"rms_norm_eps": 0}, "config.json: 'rms_norm_eps' must be a positive number, got 0"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
     "config.json: 'rope_scaling' / non-default 'rope_type' is unsupported"),
    ({"rope_theta": None}, "config.json: missing or invalid 'rope_theta' (None)"),
    ({"layer_types": ["linear_attention"] * 3}, "config.json: 'layer_types' must be a list of 4 entries"),
    ({"layer_types": ["sliding_attention"] * 4},
     "config.json: 'layer_types' has unsupported entries ['sliding_attention']"),
    ({"hidden_act": "gelu"}, "config.json: 'hidden_act' 'gelu' is unsupported (only 'silu')"),
    ({"attention_bias": True}, "config.json: 'attention_bias' true is unsupported"),
    ({"mlp_only_layers": "0"}, "config.json: 'mlp_only_layers' must be a list of layer indices, got '0'"),
])
def test_bad_keys_name_the_key(change: dict, message: str) -> None:
    assert _error(dict(NEXT, **change)) == message


def test_missing_interval_without_layer_types() -> None:
    raw = dict(NEXT)
    del raw["full_attention_interval"]
    assert _error(raw) == "config.json: missing required key 'full_attention_interval'"


def test_sliding_window_is_rejected() -> None:
    assert _error(dict(MOE, use_sliding_window=True)) == "config.json: 'use_sliding_window' true is unsupported"
