"""``config.json`` contents of the generated test/benchmark checkpoints.

Every key of the real configs is written explicitly (model-architectures.md §1.2 for
Qwen3-Next-80B-A3B, §1.3 for Qwen3.5-35B-A3B, §3 for Qwen3-30B-A3B; transformers class defaults
differ from the real files, so none are relied on). GLM-4.5 follows the GLM-4.5-Air config
(§5.6; the real file was not available, its keys are those transformers ``Glm4MoeConfig`` reads;
``num_nextn_predict_layers`` 1 as released, the MTP layer itself is not written: neither engine
loads it). gpt-oss follows the gpt-oss-120b config (§4.1: legacy ``rope_scaling`` and
``experts_per_token`` keys as in the released file). Only the sizes shrink (qwen3_5_moe has the
qwen3_next sizes, plus a one-block vision tower that the engine does not serve; glm4_moe the
qwen3_moe sizes, its first layer dense; gpt_oss H 256 / 1024 with a 32 / 128-key window):

* ``tiny``: a few MB, for the test suite; qwen3_next has 4 layers with
  ``full_attention_interval`` 4 (3 Gated DeltaNet + 1 gated attention), 16 experts, top-4.
* ``small``: for benchmarks; 12 layers of 64 experts (I = 256, H = 1024, top-8), i.e.
  12 * 64 * 3 * 1024 * 256 * 2 B = 1.21 GB of bf16 routed experts.

``max_position_embeddings`` is 262144 as in Qwen3-Next and the Qwen3-2507 MoE models (agent
clients send 20-40k-token prompts).
"""

from __future__ import annotations

ARCHES = ("qwen3_moe", "qwen3_next", "qwen3_5_moe", "glm4_moe", "gpt_oss")
PRESETS = ("tiny", "small")
MAX_POSITIONS = 262144

_SIZES = {
    ("qwen3_next", "tiny"): dict(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
        linear_value_head_dim=64, num_experts=16, num_experts_per_tok=4,
        moe_intermediate_size=128, shared_expert_intermediate_size=128, intermediate_size=512,
    ),
    ("qwen3_next", "small"): dict(
        hidden_size=1024, num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=2,
        head_dim=128, linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=128,
        linear_value_head_dim=128, num_experts=64, num_experts_per_tok=8,
        moe_intermediate_size=256, shared_expert_intermediate_size=256, intermediate_size=2048,
    ),
    ("qwen3_moe", "tiny"): dict(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, num_experts=16, num_experts_per_tok=4, moe_intermediate_size=128,
        intermediate_size=512,
    ),
    ("qwen3_moe", "small"): dict(
        hidden_size=1024, num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=2,
        head_dim=128, num_experts=64, num_experts_per_tok=8, moe_intermediate_size=256,
        intermediate_size=2048,
    ),
}


def _qwen3_next(sizes: dict, vocab: int, bos: int, eos: int) -> dict:
    return {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "vocab_size": vocab,
        "hidden_size": sizes["hidden_size"],
        "num_hidden_layers": sizes["num_hidden_layers"],
        "full_attention_interval": 4,
        "num_attention_heads": sizes["num_attention_heads"],
        "num_key_value_heads": sizes["num_key_value_heads"],
        "head_dim": sizes["head_dim"],
        "partial_rotary_factor": 0.25,
        "rope_theta": 10000000,
        "rope_scaling": None,
        "max_position_embeddings": MAX_POSITIONS,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "linear_conv_kernel_dim": 4,
        "linear_num_key_heads": sizes["linear_num_key_heads"],
        "linear_num_value_heads": sizes["linear_num_value_heads"],
        "linear_key_head_dim": sizes["linear_key_head_dim"],
        "linear_value_head_dim": sizes["linear_value_head_dim"],
        "num_experts": sizes["num_experts"],
        "num_experts_per_tok": sizes["num_experts_per_tok"],
        "moe_intermediate_size": sizes["moe_intermediate_size"],
        "shared_expert_intermediate_size": sizes["shared_expert_intermediate_size"],
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "intermediate_size": sizes["intermediate_size"],
        "hidden_act": "silu",
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "router_aux_loss_coef": 0.001,
        "output_router_logits": False,
        "use_sliding_window": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.57.0.dev0",
    }


def _mrope_section(rotary_dim: int) -> list[int]:
    """Split ``rotary_dim / 2`` frequencies into the (t, h, w) sections as the real [11, 11, 10]."""
    half = rotary_dim // 2
    t = h = -(-half // 3)
    return [t, h, half - t - h]


def _qwen3_5_moe(sizes: dict, vocab: int, bos: int, eos: int, vision_ids: dict) -> dict:
    layers = sizes["num_hidden_layers"]
    head_dim = sizes["head_dim"]
    text = {
        "model_type": "qwen3_5_moe_text",
        "vocab_size": vocab,
        "hidden_size": sizes["hidden_size"],
        "num_hidden_layers": layers,
        "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                        for i in range(layers)],
        "full_attention_interval": 4,
        "num_attention_heads": sizes["num_attention_heads"],
        "num_key_value_heads": sizes["num_key_value_heads"],
        "head_dim": head_dim,
        "attn_output_gate": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "linear_conv_kernel_dim": 4,
        "linear_num_key_heads": sizes["linear_num_key_heads"],
        "linear_num_value_heads": sizes["linear_num_value_heads"],
        "linear_key_head_dim": sizes["linear_key_head_dim"],
        "linear_value_head_dim": sizes["linear_value_head_dim"],
        "num_experts": sizes["num_experts"],
        "num_experts_per_tok": sizes["num_experts_per_tok"],
        "moe_intermediate_size": sizes["moe_intermediate_size"],
        "shared_expert_intermediate_size": sizes["shared_expert_intermediate_size"],
        "mlp_only_layers": [],
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": _mrope_section(int(head_dim * 0.25)),
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
        },
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-06,
        "hidden_act": "silu",
        "mamba_ssm_dtype": "float32",
        "router_aux_loss_coef": 0.001,
        "output_router_logits": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "dtype": "bfloat16",
    }
    vision = {
        "model_type": "qwen3_5_moe_vision",
        "depth": 1,
        "hidden_size": 32,
        "hidden_act": "gelu_pytorch_tanh",
        "intermediate_size": 64,
        "num_heads": 2,
        "in_channels": 3,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": sizes["hidden_size"],
        "num_position_embeddings": 16,
        "initializer_range": 0.02,
    }
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        **vision_ids,
        "tie_word_embeddings": False,
        "text_config": text,
        "vision_config": vision,
        "transformers_version": "5.2.0",
    }


def _glm4_moe(sizes: dict, vocab: int, pad: int, stops: list[int]) -> dict:
    return {
        "architectures": ["Glm4MoeForCausalLM"],
        "attention_bias": True,
        "attention_dropout": 0.0,
        "pad_token_id": pad,
        "eos_token_id": stops,
        "head_dim": sizes["head_dim"],
        "hidden_act": "silu",
        "hidden_size": sizes["hidden_size"],
        "partial_rotary_factor": 0.5,
        "initializer_range": 0.02,
        "intermediate_size": sizes["intermediate_size"],
        "max_position_embeddings": 131072,
        "model_type": "glm4_moe",
        "moe_intermediate_size": sizes["moe_intermediate_size"],
        "norm_topk_prob": True,
        "num_attention_heads": sizes["num_attention_heads"],
        "n_group": 1,
        "topk_group": 1,
        "n_routed_experts": sizes["num_experts"],
        "n_shared_experts": 1,
        "routed_scaling_factor": 1.0,
        "num_experts_per_tok": sizes["num_experts_per_tok"],
        "first_k_dense_replace": 1,
        "num_hidden_layers": sizes["num_hidden_layers"],
        "num_key_value_heads": sizes["num_key_value_heads"],
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "num_nextn_predict_layers": 1,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.54.0",
        "use_cache": True,
        "use_qk_norm": False,
        "vocab_size": vocab,
    }


_GPT_OSS = {  # H and I multiples of 32 (MXFP4 groups); top-4 as released
    "tiny": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, num_local_experts=16,
                 intermediate_size=128, sliding_window=32),
    "small": dict(hidden_size=1024, num_hidden_layers=12, num_attention_heads=16,
                  num_key_value_heads=2, head_dim=64, num_local_experts=64,
                  intermediate_size=512, sliding_window=128),
}


def _gpt_oss(sizes: dict, vocab: int, pad: int, stops: list[int]) -> dict:
    layers = sizes["num_hidden_layers"]
    return {
        "architectures": ["GptOssForCausalLM"],
        "attention_bias": True,
        "attention_dropout": 0.0,
        "eos_token_id": stops[0],
        "experts_per_token": 4,
        "head_dim": sizes["head_dim"],
        "hidden_act": "silu",
        "hidden_size": sizes["hidden_size"],
        "initial_context_length": 4096,
        "initializer_range": 0.02,
        "intermediate_size": sizes["intermediate_size"],
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention"
                        for i in range(layers)],
        "max_position_embeddings": 131072,
        "model_type": "gpt_oss",
        "num_attention_heads": sizes["num_attention_heads"],
        "num_experts_per_tok": 4,
        "num_hidden_layers": layers,
        "num_key_value_heads": sizes["num_key_value_heads"],
        "num_local_experts": sizes["num_local_experts"],
        "output_router_logits": False,
        "pad_token_id": pad,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                         "original_max_position_embeddings": 4096, "rope_type": "yarn",
                         "truncate": False},
        "rope_theta": 150000,
        "router_aux_loss_coef": 0.9,
        "sliding_window": sizes["sliding_window"],
        "swiglu_limit": 7.0,
        "tie_word_embeddings": False,
        "transformers_version": "4.55.0.dev0",
        "use_cache": True,
        "vocab_size": vocab,
    }


def _qwen3_moe(sizes: dict, vocab: int, bos: int, eos: int) -> dict:
    layers = sizes["num_hidden_layers"]
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos,
        "decoder_sparse_step": 1,
        "eos_token_id": eos,
        "head_dim": sizes["head_dim"],
        "hidden_act": "silu",
        "hidden_size": sizes["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": sizes["intermediate_size"],
        "max_position_embeddings": MAX_POSITIONS,
        "max_window_layers": layers,
        "mlp_only_layers": [],
        "model_type": "qwen3_moe",
        "moe_intermediate_size": sizes["moe_intermediate_size"],
        "norm_topk_prob": True,
        "num_attention_heads": sizes["num_attention_heads"],
        "num_experts": sizes["num_experts"],
        "num_experts_per_tok": sizes["num_experts_per_tok"],
        "num_hidden_layers": layers,
        "num_key_value_heads": sizes["num_key_value_heads"],
        "output_router_logits": False,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 10000000,
        "router_aux_loss_coef": 0.001,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab,
    }


def preset_config(arch: str, preset: str, vocab_size: int, bos_id: int, eos_id: int,
                  vision_ids: dict | None = None, stop_ids: list[int] | None = None) -> dict:
    """The full ``config.json`` dict of ``arch`` at ``preset`` size.

    Args:
        arch: one of :data:`ARCHES`.
        preset: ``"tiny"`` or ``"small"``.
        vocab_size: embedding rows (tokenizer size rounded up to a multiple of 64).
        bos_id, eos_id: ids of ``<|endoftext|>`` and ``<|im_end|>``.
        vision_ids: qwen3_5_moe's ``image_token_id``, ``video_token_id``,
            ``vision_start_token_id``, ``vision_end_token_id`` (the tokenizer's ids).
        stop_ids: glm4_moe's ``eos_token_id`` list (default ``[eos_id]``); ``bos_id`` is its
            pad token.

    Raises:
        ValueError: unknown arch or preset (lists the valid ones).
    """
    if arch not in ARCHES:
        raise ValueError(f"unknown arch {arch!r}; expected one of {', '.join(ARCHES)}")
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; expected one of {', '.join(PRESETS)}")
    if arch == "qwen3_5_moe":
        sizes = _SIZES[("qwen3_next", preset)]
        return _qwen3_5_moe(sizes, vocab_size, bos_id, eos_id, vision_ids or {})
    if arch == "gpt_oss":
        return _gpt_oss(_GPT_OSS[preset], vocab_size, bos_id, stop_ids or [eos_id])
    if arch == "glm4_moe":
        return _glm4_moe(_SIZES[("qwen3_moe", preset)], vocab_size, bos_id, stop_ids or [eos_id])
    build = _qwen3_next if arch == "qwen3_next" else _qwen3_moe
    return build(_SIZES[(arch, preset)], vocab_size, bos_id, eos_id)
