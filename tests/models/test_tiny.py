"""make_tiny: HF layout, every real config key, determinism, im_end row, cached default model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from freetoken.models import tiny
from freetoken.models.config import ModelConfig
from freetoken.models.tiny_presets import preset_config
from freetoken.models.tiny_weights import generate
from freetoken.paths import TEMPLATES_DIR
from freetoken.tokenizer.tokenizer import Tokenizer

# Keys of the real config.json files (model-architectures.md §1.2 Qwen3-Next-80B-A3B, §3 Qwen3-30B-A3B).
REAL_KEYS = {
    "qwen3_next": {
        "architectures", "model_type", "vocab_size", "hidden_size", "num_hidden_layers",
        "full_attention_interval", "num_attention_heads", "num_key_value_heads", "head_dim",
        "partial_rotary_factor", "rope_theta", "rope_scaling", "max_position_embeddings",
        "attention_bias", "attention_dropout", "linear_conv_kernel_dim", "linear_num_key_heads",
        "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim", "num_experts",
        "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
        "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers", "intermediate_size",
        "hidden_act", "rms_norm_eps", "tie_word_embeddings", "bos_token_id", "eos_token_id",
        "router_aux_loss_coef", "output_router_logits", "use_sliding_window", "initializer_range",
        "use_cache", "torch_dtype", "transformers_version",
    },
    "qwen3_moe": {
        "architectures", "attention_bias", "attention_dropout", "bos_token_id", "decoder_sparse_step",
        "eos_token_id", "head_dim", "hidden_act", "hidden_size", "initializer_range",
        "intermediate_size", "max_position_embeddings", "max_window_layers", "mlp_only_layers",
        "model_type", "moe_intermediate_size", "norm_topk_prob", "num_attention_heads", "num_experts",
        "num_experts_per_tok", "num_hidden_layers", "num_key_value_heads", "output_router_logits",
        "rms_norm_eps", "rope_scaling", "rope_theta", "router_aux_loss_coef", "sliding_window",
        "tie_word_embeddings", "torch_dtype", "transformers_version", "use_cache",
        "use_sliding_window", "vocab_size",
    },
}
IM_END, ENDOFTEXT = 8194, 8192


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen3_next"])
def test_layout_and_files(arch: str, tiny_checkpoint) -> None:
    path = tiny_checkpoint(arch)
    config = json.loads((path / "config.json").read_text())
    assert REAL_KEYS[arch] <= set(config)
    assert config["vocab_size"] == 8256  # 8218 tokenizer entries rounded up to a multiple of 64
    assert config["max_position_embeddings"] == 262144 and config["torch_dtype"] == "bfloat16"
    size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    assert 10e6 <= size <= 50e6
    with safe_open(path / "model.safetensors", framework="pt") as f:
        names = set(f.keys())
        dtypes = {n: f.get_slice(n).get_dtype() for n in names}
    assert {"model.layers.0.mlp.experts.15.gate_proj.weight", "model.layers.3.mlp.experts.0.down_proj.weight",
            "lm_head.weight", "model.embed_tokens.weight"} <= names
    assert {d for n, d in dtypes.items() if not n.endswith("A_log")} == {"BF16"}
    if arch == "qwen3_next":
        assert "model.layers.3.self_attn.q_proj.weight" in names
        assert "model.layers.2.linear_attn.in_proj_qkvz.weight" in names
        assert "model.layers.0.mlp.shared_expert_gate.weight" in names
    gen = json.loads((path / "generation_config.json").read_text())
    assert (gen["eos_token_id"], gen["bos_token_id"]) == ([IM_END, ENDOFTEXT], ENDOFTEXT)
    tok_config = json.loads((path / "tokenizer_config.json").read_text())
    assert tok_config["chat_template"] == (TEMPLATES_DIR / f"{arch}.jinja").read_text()
    assert (tok_config["eos_token"], tok_config["pad_token"], tok_config["bos_token"]) == (
        "<|im_end|>", "<|endoftext|>", None)
    assert tok_config["tokenizer_class"] == "Qwen2Tokenizer"
    assert tok_config["model_max_length"] == 262144
    added = tok_config["added_tokens_decoder"]
    assert added[str(IM_END)] == {"content": "<|im_end|>", "lstrip": False, "normalized": False,
                                  "rstrip": False, "single_word": False, "special": True}
    assert added["8216"]["content"] == "<think>" and added["8216"]["special"] is False
    tok = Tokenizer.from_pretrained(path)
    assert tok.eos_token_ids == (IM_END, ENDOFTEXT)
    assert tok.chat_template == tok_config["chat_template"]


def test_deterministic_for_a_seed(tmp_path: Path) -> None:
    a = tiny.make_tiny("qwen3_next", "tiny", tmp_path / "a", seed=5)
    b = tiny.make_tiny("qwen3_next", "tiny", tmp_path / "b", seed=5)
    c = tiny.make_tiny("qwen3_next", "tiny", tmp_path / "c", seed=6)
    for name in ("model.safetensors", "config.json", "tokenizer_config.json", tiny.STAMP_FILE):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    wa, wc = load_file(a / "model.safetensors"), load_file(c / "model.safetensors")
    assert not torch.equal(wa["model.layers.0.mlp.experts.0.gate_proj.weight"],
                           wc["model.layers.0.mlp.experts.0.gate_proj.weight"])


def test_only_the_im_end_row_departs_from_the_seeded_init(tiny_checkpoint) -> None:
    path = tiny_checkpoint("qwen3_next")
    stamp = json.loads((path / tiny.STAMP_FILE).read_text())
    scale = stamp["im_end_row_scale"]
    assert 1 <= abs(scale) <= 200
    stored = load_file(path / "model.safetensors")
    fresh = dict((spec.name, t) for spec, t in generate(ModelConfig.from_file(path), seed=0))
    assert stored.keys() == fresh.keys()
    for name, value in fresh.items():
        if name != "lm_head.weight":
            assert torch.equal(stored[name], value), name
    head = stored["lm_head.weight"]
    rows = torch.arange(head.shape[0]) != IM_END
    assert torch.equal(head[rows], fresh["lm_head.weight"][rows])
    assert torch.equal(head[IM_END], (fresh["lm_head.weight"][IM_END].float() * scale).bfloat16())


def test_small_preset_sizes() -> None:
    for arch in ("qwen3_moe", "qwen3_next", "qwen3_5_moe"):
        c = ModelConfig.from_hf(preset_config(arch, "small", 8256, ENDOFTEXT, IM_END))
        moe_layers = sum(c.is_moe_layer(i) for i in range(c.num_hidden_layers))
        routed_bytes = moe_layers * c.num_experts * 3 * c.hidden_size * c.moe_intermediate_size * 2
        assert routed_bytes >= 1e9
        assert c.num_experts >= 64 and c.num_experts_per_tok == 8
    with pytest.raises(ValueError) as err:
        preset_config("qwen3_moe", "huge", 8256, ENDOFTEXT, IM_END)
    assert str(err.value) == "unknown preset 'huge'; expected one of tiny, small"


def test_default_model_path_is_generated_once(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FREETOKEN_CACHE", str(tmp_path))
    messages: list[str] = []
    path = tiny.default_model_path(progress=messages.append)
    assert path == tmp_path / "models" / "tiny-qwen3_next"
    assert len(messages) == 1 and (path / "model.safetensors").is_file()
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["tiny-qwen3_next"]  # no temp dirs left
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert tiny.default_model_path(progress=messages.append) == path
    assert len(messages) == 1 and (path / "model.safetensors").stat().st_mtime_ns == mtime
    stamp = json.loads((path / tiny.STAMP_FILE).read_text())
    (path / tiny.STAMP_FILE).write_text(json.dumps(dict(stamp, version=-1)))
    assert tiny.default_model_path(progress=messages.append) == path
    assert len(messages) == 2
    assert json.loads((path / tiny.STAMP_FILE).read_text())["version"] == tiny.GENERATOR_VERSION


def test_sharded_writer_streams_the_same_tensors(tmp_path: Path, tiny_checkpoint) -> None:
    from freetoken.models.tiny_weights import write_safetensors

    config = ModelConfig.from_file(tiny_checkpoint("qwen3_moe"))
    files = write_safetensors(config, seed=0, out_dir=tmp_path, max_shard_bytes=4 * 2**20)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in tmp_path.glob("model-*.safetensors"))
    assert len(shards) >= 5 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert set(index["weight_map"].values()) == set(shards) and len(files) == len(shards) + 1
    assert all(p.stat().st_size <= 4 * 2**20 + 2**16 for p in tmp_path.glob("model-*.safetensors"))
    streamed = {}
    for shard in shards:
        streamed.update(load_file(tmp_path / shard))
    fresh = dict((spec.name, t) for spec, t in generate(config, seed=0))
    assert streamed.keys() == fresh.keys()
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in fresh.values())
    assert all(torch.equal(streamed[n], fresh[n]) for n in fresh)
