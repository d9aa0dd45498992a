"""GLM-4.5 (glm4_moe) beyond the shared parity tests: the router and layout variants of the
releases against transformers, its MTP layer left unloaded, bad router configs refused."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from freetoken.models.config import ModelConfig
from freetoken.models.registry import load_model
from freetoken.models.tiny import make_tiny
from tests.models.conftest import load_hf, prompt_ids

VARIANTS = {
    "glm45_qk_norm_groups": {"use_qk_norm": True, "n_group": 4, "topk_group": 2,
                             "routed_scaling_factor": 2.5},
    "two_dense_two_shared_no_renorm": {"first_k_dense_replace": 2, "n_shared_experts": 2,
                                       "norm_topk_prob": False},
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variants_match_transformers(name, tmp_path) -> None:
    path = make_tiny("glm4_moe", "tiny", tmp_path / name, config_overrides=VARIANTS[name])
    ft = load_model(path)
    ids = prompt_ids(path, 70)
    with torch.no_grad():
        ref = load_hf(path)(ids[None]).logits[0]
    assert (ft(ids, ft.new_state(), all_logits=True) - ref).abs().max().item() <= 1e-4
    dense = VARIANTS[name].get("first_k_dense_replace", 1)
    assert [ft.config.is_moe_layer(i) for i in range(4)] == [False] * dense + [True] * (4 - dense)


def test_released_tensor_names_and_dtypes(tiny_checkpoint) -> None:
    path = tiny_checkpoint("glm4_moe")
    with safe_open(path / "model.safetensors", framework="pt") as f:
        dtypes = {n: f.get_slice(n).get_dtype() for n in f.keys()}
    layer = "model.layers.1."
    assert dtypes[layer + "mlp.gate.e_score_correction_bias"] == "F32"
    for name in ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias",
                 "mlp.shared_experts.gate_proj.weight", "mlp.experts.15.down_proj.weight",
                 "mlp.gate.weight"):
        assert dtypes[layer + name] == "BF16", name
    assert "model.layers.0.mlp.gate_proj.weight" in dtypes  # first_k_dense_replace = 1
    assert not [n for n in dtypes if "q_norm" in n or "o_proj.bias" in n]
    config = json.loads((path / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == 1 and config["partial_rotary_factor"] == 0.5
    assert json.loads((path / "generation_config.json").read_text())["eos_token_id"] == [
        8192, 8199, 8201]  # <|endoftext|>, <|user|>, <|observation|>


def test_the_mtp_layer_is_not_loaded(tiny_checkpoint, tmp_path) -> None:
    """The releases store the MTP layer as ``model.layers.{L}``; it is skipped, and a stray
    layer in a config without one is an error."""
    src = tiny_checkpoint("glm4_moe")
    dst = tmp_path / "with-mtp"
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    extra = {n.replace("model.layers.3.", "model.layers.4."): t.clone()
             for n, t in tensors.items() if n.startswith("model.layers.3.")}
    extra["model.layers.4.eh_proj.weight"] = torch.zeros(256, 512, dtype=torch.bfloat16)
    save_file({**tensors, **extra}, str(dst / "model.safetensors"), metadata={"format": "pt"})
    ids = prompt_ids(src, 20)
    a, b = load_model(src), load_model(dst)
    assert torch.equal(a(ids, a.new_state()), b(ids, b.new_state()))
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(dict(config, num_nextn_predict_layers=0)))
    with pytest.raises(ValueError, match=r"has \d+ unexpected tensor\(s\)"):
        load_model(dst)


@pytest.mark.parametrize("change, message", [
    ({"n_group": 3}, "config.json: 'n_group' 3 must divide 'n_routed_experts' 16 and be >= "
                     "'topk_group' 1"),
    ({"n_group": 4, "topk_group": 1, "num_experts_per_tok": 5},
     "config.json: 'num_experts_per_tok' 5 exceeds the experts of 'topk_group' 1 groups"),
    ({"n_group": 16}, "config.json: each of 'n_group' groups needs at least 2 experts (a group "
                      "scores by its two best)"),
])
def test_bad_router_configs_are_refused(tiny_checkpoint, change, message) -> None:
    raw = json.loads((tiny_checkpoint("glm4_moe") / "config.json").read_text())
    with pytest.raises(ValueError) as err:
        ModelConfig.from_hf(dict(raw, **change))
    assert str(err.value) == message
