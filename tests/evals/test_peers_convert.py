"""``evals/peers/convert_gguf.py`` on the tiny qwen3_next, qwen3_5_moe and glm4_moe checkpoints:
the GGUF holds the tensors, shapes and keys llama.cpp's ``qwen3next`` / ``qwen35moe`` /
``glm4moe`` loaders ask for; the regrouped qwen3_next tensors give the same q/k/v/z/b/a as the
Hugging Face model's own split, the qwen3_5_moe DeltaNet layer computed from the GGUF tensors the
way llama.cpp's graph does (value heads reading key heads by tiling) equals the Hugging Face
layer, and so does a glm4_moe MoE block routed from the GGUF tensors and keys the way llama.cpp's
``build_moe_ffn`` does (sigmoid scores, selection bias, expert groups, routed scale).

The converter needs the ``gguf`` package, which lives in the peer venv of
``evals/peers/build_llamacpp_tools.sh`` (``$FREETOKEN_CACHE/peers/llamacpp-tools-0.3.36/
gguf-0.19.0-venv``, or ``FREETOKEN_GGUF_PYTHON``), not in the project venv: it runs there as a
subprocess, and these tests are skipped when that python is missing (nothing is built here).
Run: ``.venv/bin/pytest tests/evals/test_peers_convert.py`` (a few seconds). llama.cpp itself is
checked end to end by ``parity_llamacpp.py`` (see ``evals/peers/README.md``).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers.models.glm4_moe.configuration_glm4_moe import Glm4MoeConfig
from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeMoE
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeGatedDeltaNet

from freetoken.models.tiny import cached_tiny

REPO = Path(__file__).resolve().parents[2]
CONVERT = REPO / "evals" / "peers" / "convert_gguf.py"
_CACHE = Path(os.environ.get("FREETOKEN_CACHE", Path.home() / ".cache" / "freetoken"))
GGUF_PYTHON = Path(os.environ.get(
    "FREETOKEN_GGUF_PYTHON",
    _CACHE / "peers" / "llamacpp-tools-0.3.36" / "gguf-0.19.0-venv" / "bin" / "python"))

pytestmark = pytest.mark.skipif(not GGUF_PYTHON.is_file(),
                                reason=f"no gguf python at {GGUF_PYTHON} (build_llamacpp_tools.sh)")

# Reads a GGUF back (gguf's own reader) into metadata.json + tensors.npz (float32, numpy order).
_DUMP = """
import json, sys, numpy as np, gguf
r = gguf.GGUFReader(sys.argv[1])
meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.")
        or k.endswith("_id") or k == "tokenizer.ggml.pre"}
info, arrays = {}, {}
for t in r.tensors:
    info[t.name] = [[int(n) for n in t.shape], t.tensor_type.name]
    data = np.asarray(t.data)
    if t.tensor_type.name == "BF16":
        data = (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    arrays[t.name] = data.astype(np.float32).reshape([int(n) for n in t.shape][::-1])
json.dump({"meta": meta, "tensors": info}, open(sys.argv[2] + "/metadata.json", "w"))
np.savez(sys.argv[2] + "/tensors.npz", **arrays)
"""


def _convert(model: Path, out_dir: Path, outtype: str) -> tuple[dict, dict]:
    out_dir.mkdir(parents=True, exist_ok=True)
    gguf_path = out_dir / f"model-{outtype}.gguf"
    subprocess.run([str(GGUF_PYTHON), str(CONVERT), str(model), str(gguf_path), "--outtype",
                    outtype], check=True, capture_output=True, timeout=300)
    subprocess.run([str(GGUF_PYTHON), "-c", _DUMP, str(gguf_path), str(out_dir)], check=True,
                   capture_output=True, timeout=300)
    with np.load(out_dir / "tensors.npz") as z:
        arrays = {k: z[k] for k in z.files}
    return json.loads((out_dir / "metadata.json").read_text()), arrays


@pytest.fixture(scope="module")
def tiny_next() -> Path:
    return cached_tiny("qwen3_next", "tiny")


@pytest.fixture(scope="module")
def converted(tiny_next: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("gguf")
    return {t: _convert(tiny_next, root / t, t) for t in ("f32", "bf16")}


def _expected_tensors(c: dict) -> dict[str, list[int]]:
    """Name -> ggml ne of every tensor llama.cpp's qwen3next ``load_arch_tensors`` creates for
    this config (no MTP block, untied output)."""
    h, v, e = c["hidden_size"], c["vocab_size"], c["num_experts"]
    d, nq, nkv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    nk, nv, dk = c["linear_num_key_heads"], c["linear_num_value_heads"], c["linear_key_head_dim"]
    vdim, conv = nv * c["linear_value_head_dim"], 2 * nk * dk + nv * c["linear_value_head_dim"]
    fe, fs = c["moe_intermediate_size"], c["shared_expert_intermediate_size"]
    out = {"token_embd.weight": [h, v], "output_norm.weight": [h], "output.weight": [h, v]}
    for i in range(c["num_hidden_layers"]):
        b = f"blk.{i}."
        out |= {b + "attn_norm.weight": [h], b + "post_attention_norm.weight": [h],
                b + "ffn_gate_inp.weight": [h, e], b + "ffn_gate_exps.weight": [h, fe, e],
                b + "ffn_up_exps.weight": [h, fe, e], b + "ffn_down_exps.weight": [fe, h, e],
                b + "ffn_gate_inp_shexp.weight": [h], b + "ffn_gate_shexp.weight": [h, fs],
                b + "ffn_up_shexp.weight": [h, fs], b + "ffn_down_shexp.weight": [fs, h]}
        if (i + 1) % c["full_attention_interval"]:
            out |= {b + "attn_qkv.weight": [h, conv], b + "attn_gate.weight": [h, vdim],
                    b + "ssm_conv1d.weight": [c["linear_conv_kernel_dim"], conv],
                    b + "ssm_dt.bias": [nv], b + "ssm_a": [nv], b + "ssm_ba.weight": [h, 2 * nv],
                    b + "ssm_norm.weight": [c["linear_value_head_dim"]],
                    b + "ssm_out.weight": [vdim, h]}
        else:
            out |= {b + "attn_q.weight": [h, nq * d * 2], b + "attn_k.weight": [h, nkv * d],
                    b + "attn_v.weight": [h, nkv * d], b + "attn_output.weight": [nq * d, h],
                    b + "attn_q_norm.weight": [d], b + "attn_k_norm.weight": [d]}
    return out


def test_tensors_and_keys_are_what_llama_cpp_qwen3next_loads(tiny_next: Path,
                                                             converted: dict) -> None:
    c = json.loads((tiny_next / "config.json").read_text())
    meta, _ = converted["f32"]
    assert {k: v[0] for k, v in meta["tensors"].items()} == _expected_tensors(c)
    kv = meta["meta"]
    assert kv["general.architecture"] == "qwen3next"
    assert {k.removeprefix("qwen3next."): kv[k] for k in kv if k.startswith("qwen3next.")} == {
        "block_count": 4, "context_length": 262144, "embedding_length": 256,
        "feed_forward_length": 512, "attention.head_count": 4, "attention.head_count_kv": 2,
        "attention.key_length": 64, "attention.value_length": 64, "rope.freq_base": 1e7,
        "attention.layer_norm_rms_epsilon": pytest.approx(1e-6), "expert_count": 16,
        "expert_used_count": 4, "expert_feed_forward_length": 128,
        "rope.dimension_count": 16, "expert_shared_feed_forward_length": 128,
        "full_attention_interval": 4, "ssm.conv_kernel": 4, "ssm.state_size": 64,
        "ssm.group_count": 2, "ssm.time_step_rank": 4, "ssm.inner_size": 256}
    types = {k: v[1] for k, v in converted["bf16"][0]["tensors"].items()}
    assert types["blk.0.ssm_conv1d.weight"] == types["blk.0.ffn_gate_inp.weight"] == "F32"
    assert types["blk.0.attn_qkv.weight"] == types["blk.3.attn_q.weight"] == "BF16"


def test_bf16_file_is_the_f32_file_without_rounding(converted: dict) -> None:
    f32, bf16 = converted["f32"][1], converted["bf16"][1]
    assert f32.keys() == bf16.keys()
    for name, x in f32.items():
        assert np.array_equal(x, bf16[name]), name


def test_regrouped_projections_split_like_the_hf_model(tiny_next: Path, converted: dict) -> None:
    c = json.loads((tiny_next / "config.json").read_text())
    hf = load_file(tiny_next / "model.safetensors")
    arrays = converted["f32"][1]
    la = "model.layers.0.linear_attn."
    x = torch.randn(5, c["hidden_size"], generator=torch.Generator().manual_seed(0))
    stub = SimpleNamespace(num_k_heads=c["linear_num_key_heads"],
                           num_v_heads=c["linear_num_value_heads"],
                           head_k_dim=c["linear_key_head_dim"],
                           head_v_dim=c["linear_value_head_dim"])
    mixed_qkvz = (x @ hf[la + "in_proj_qkvz.weight"].float().T)[None]
    mixed_ba = (x @ hf[la + "in_proj_ba.weight"].float().T)[None]
    q, k, v, z, b, a = Qwen3NextGatedDeltaNet.fix_query_key_value_ordering(stub, mixed_qkvz,
                                                                           mixed_ba)
    conv_input = torch.cat([t.reshape(5, -1) for t in (q[0], k[0], v[0])], dim=-1)
    got_qkv = x.numpy() @ arrays["blk.0.attn_qkv.weight"].T
    np.testing.assert_allclose(got_qkv, conv_input.numpy(), rtol=0, atol=1e-6)
    got_z = x.numpy() @ arrays["blk.0.attn_gate.weight"].T
    np.testing.assert_allclose(got_z, z[0].reshape(5, -1).numpy(), rtol=0, atol=1e-6)
    # llama.cpp reads ssm_ba as [nk groups of (b: r, a: r)], as the HF split does
    r = stub.num_v_heads // stub.num_k_heads
    ba = (x.numpy() @ arrays["blk.0.ssm_ba.weight"].T).reshape(5, stub.num_k_heads, 2 * r)
    np.testing.assert_allclose(ba[..., :r].reshape(5, -1), b[0].numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(ba[..., r:].reshape(5, -1), a[0].numpy(), rtol=0, atol=1e-6)


def test_norms_a_log_conv_and_shared_gate_transforms(tiny_next: Path, converted: dict) -> None:
    hf = {k: t.float().numpy() for k, t in load_file(tiny_next / "model.safetensors").items()}
    arrays = converted["f32"][1]
    m = "model.layers."
    np.testing.assert_array_equal(arrays["output_norm.weight"], hf["model.norm.weight"] + 1)
    np.testing.assert_array_equal(arrays["blk.0.attn_norm.weight"],
                                  hf[m + "0.input_layernorm.weight"] + 1)
    np.testing.assert_array_equal(arrays["blk.0.post_attention_norm.weight"],
                                  hf[m + "0.post_attention_layernorm.weight"] + 1)
    np.testing.assert_array_equal(arrays["blk.3.attn_q_norm.weight"],
                                  hf[m + "3.self_attn.q_norm.weight"] + 1)
    np.testing.assert_array_equal(arrays["blk.3.attn_k_norm.weight"],
                                  hf[m + "3.self_attn.k_norm.weight"] + 1)
    np.testing.assert_array_equal(arrays["blk.0.ssm_norm.weight"],  # gated norm: plain weight
                                  hf[m + "0.linear_attn.norm.weight"])
    np.testing.assert_allclose(arrays["blk.0.ssm_a"], -np.exp(hf[m + "0.linear_attn.A_log"]),
                               rtol=1e-7)
    np.testing.assert_array_equal(arrays["blk.0.ssm_conv1d.weight"],
                                  hf[m + "0.linear_attn.conv1d.weight"][:, 0, :])
    np.testing.assert_array_equal(arrays["blk.0.ffn_gate_inp_shexp.weight"],
                                  hf[m + "0.mlp.shared_expert_gate.weight"][0])
    np.testing.assert_array_equal(arrays["blk.3.attn_q.weight"],  # [query, gate] per head: as is
                                  hf[m + "3.self_attn.q_proj.weight"])


@pytest.mark.parametrize(("change", "message"), [
    ({"linear_value_head_dim": 32}, "linear_key_head_dim != linear_value_head_dim"),
    ({"layer_types": ["full_attention"] * 4}, "layer_types is not the full_attention_interval"),
    ({"norm_topk_prob": False}, "norm_topk_prob=false: llama.cpp's qwen3next"),
    ({"model_type": "qwen3"}, "model_type 'qwen3' is not mapped"),
])
def test_unmappable_configs_are_refused(tiny_next: Path, tmp_path: Path, change: dict,
                                        message: str) -> None:
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).symlink_to(tiny_next / name)
    config = json.loads((tiny_next / "config.json").read_text()) | change
    (tmp_path / "config.json").write_text(json.dumps(config))
    res = subprocess.run([str(GGUF_PYTHON), str(CONVERT), str(tmp_path), str(tmp_path / "o.gguf")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and message in res.stderr, res.stderr
    assert not (tmp_path / "o.gguf").exists()


@pytest.fixture(scope="module")
def tiny_35() -> Path:
    return cached_tiny("qwen3_5_moe", "tiny")


@pytest.fixture(scope="module")
def converted_35(tiny_35: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("gguf35")
    return {t: _convert(tiny_35, root / t, t) for t in ("f32", "bf16")}


def _expected_tensors_35(c: dict) -> dict[str, list[int]]:
    """Name -> ggml ne of every tensor llama.cpp's qwen35moe ``load_arch_tensors`` creates (fused
    gate_up experts, split beta / alpha; no vision tower, no MTP block)."""
    h, e, fe = c["hidden_size"], c["num_experts"], c["moe_intermediate_size"]
    nv, dv = c["linear_num_value_heads"], c["linear_value_head_dim"]
    out = {}
    for name, ne in _expected_tensors(c).items():
        if "ffn_gate_exps" in name:
            out[name.replace("gate_exps", "gate_up_exps")] = [h, 2 * fe, e]
        elif "ssm_ba" in name:
            out |= {name.replace("ba", "beta"): [h, nv], name.replace("ba", "alpha"): [h, nv]}
        elif "ffn_up_exps" not in name:
            out[name] = ne
    assert out["blk.0.attn_gate.weight"] == [h, nv * dv]
    return out


def test_qwen3_5_tensors_and_keys_are_what_llama_cpp_qwen35moe_loads(tiny_35: Path,
                                                                    converted_35: dict) -> None:
    raw = json.loads((tiny_35 / "config.json").read_text())
    c = raw["text_config"] | {"full_attention_interval": 4}
    meta, _ = converted_35["f32"]
    assert {k: v[0] for k, v in meta["tensors"].items()} == _expected_tensors_35(c)
    kv = meta["meta"]
    assert kv["general.architecture"] == "qwen35moe"
    assert {k.removeprefix("qwen35moe."): kv[k] for k in kv if k.startswith("qwen35moe.")} == {
        "block_count": 4, "context_length": 262144, "embedding_length": 256,
        "attention.head_count": 4, "attention.head_count_kv": 2,
        "attention.key_length": 64, "attention.value_length": 64, "rope.freq_base": 1e7,
        "attention.layer_norm_rms_epsilon": pytest.approx(1e-6), "expert_count": 16,
        "expert_used_count": 4, "expert_feed_forward_length": 128,
        "rope.dimension_count": 16, "rope.dimension_sections": [3, 3, 2, 0],
        "expert_shared_feed_forward_length": 128, "full_attention_interval": 4,
        "ssm.conv_kernel": 4, "ssm.state_size": 64, "ssm.group_count": 2,
        "ssm.time_step_rank": 4, "ssm.inner_size": 256}
    types = {k: v[1] for k, v in converted_35["bf16"][0]["tensors"].items()}
    assert types["blk.0.ssm_conv1d.weight"] == types["blk.0.ssm_norm.weight"] == "F32"
    assert types["blk.0.attn_qkv.weight"] == types["blk.0.ffn_gate_up_exps.weight"] == "BF16"
    f32, bf16 = converted_35["f32"][1], converted_35["bf16"][1]
    assert all(np.array_equal(x, bf16[name]) for name, x in f32.items())  # exact for bf16 weights


def test_qwen3_5_copied_tensors_and_norms(tiny_35: Path, converted_35: dict) -> None:
    hf = {k: t.float().numpy() for k, t in load_file(tiny_35 / "model.safetensors").items()}
    arrays, m = converted_35["f32"][1], "model.language_model."
    np.testing.assert_array_equal(arrays["token_embd.weight"], hf[m + "embed_tokens.weight"])
    np.testing.assert_array_equal(arrays["output.weight"], hf["lm_head.weight"])
    np.testing.assert_array_equal(arrays["output_norm.weight"], hf[m + "norm.weight"] + 1)
    np.testing.assert_array_equal(arrays["blk.3.attn_q_norm.weight"],
                                  hf[m + "layers.3.self_attn.q_norm.weight"] + 1)
    np.testing.assert_array_equal(arrays["blk.3.attn_q.weight"],
                                  hf[m + "layers.3.self_attn.q_proj.weight"])
    np.testing.assert_array_equal(arrays["blk.1.ffn_gate_up_exps.weight"],
                                  hf[m + "layers.1.mlp.experts.gate_up_proj"])
    np.testing.assert_array_equal(arrays["blk.1.ffn_down_exps.weight"],
                                  hf[m + "layers.1.mlp.experts.down_proj"])
    np.testing.assert_array_equal(arrays["blk.0.ssm_norm.weight"],
                                  hf[m + "layers.0.linear_attn.norm.weight"])


def _deltanet(t: dict, x: np.ndarray, key_head, eps: float) -> np.ndarray:
    """A Gated DeltaNet layer (no cache) in float64 from GGUF-named tensors ``t``: value head h
    reads key head ``key_head(h)``; the recurrence of ggml's ``gated_delta_net`` op."""
    n, (kernel, channels) = len(x), t["ssm_conv1d.weight"].shape[::-1]
    nv, dv = t["ssm_a"].shape[0], t["ssm_norm.weight"].shape[0]
    dk = dv  # ssm.state_size
    nk = (channels - nv * dv) // (2 * dk)
    mixed = np.concatenate([np.zeros((kernel - 1, channels)), x @ t["attn_qkv.weight"].T])
    conv = sum(mixed[i:i + n] * t["ssm_conv1d.weight"][:, i] for i in range(kernel))
    conv = conv / (1 + np.exp(-conv))
    q, k = (conv[:, s * nk * dk:(s + 1) * nk * dk].reshape(n, nk, dk) for s in (0, 1))
    q, k = (a / np.sqrt((a * a).sum(-1, keepdims=True) + eps) for a in (q, k))
    v = conv[:, 2 * nk * dk:].reshape(n, nv, dv)
    beta = 1 / (1 + np.exp(-(x @ t["ssm_beta.weight"].T)))
    decay = np.exp(np.log1p(np.exp(x @ t["ssm_alpha.weight"].T + t["ssm_dt.bias"])) * t["ssm_a"])
    state, out = np.zeros((nv, dk, dv)), np.zeros((n, nv, dv))
    for i in range(n):
        for h in range(nv):
            kh, qh = k[i, key_head(h)], q[i, key_head(h)] / np.sqrt(dk)
            state[h] *= decay[i, h]
            state[h] += np.outer(kh, (v[i, h] - kh @ state[h]) * beta[i, h])
            out[i, h] = qh @ state[h]
    out = out / np.sqrt((out * out).mean(-1, keepdims=True) + eps) * t["ssm_norm.weight"]
    z = (x @ t["attn_gate.weight"].T).reshape(n, nv, dv)
    return (out * z / (1 + np.exp(-z))).reshape(n, -1) @ t["ssm_out.weight"].T


def test_qwen3_5_deltanet_with_tiled_heads_equals_the_hf_layer(tiny_35: Path,
                                                              converted_35: dict) -> None:
    c = json.loads((tiny_35 / "config.json").read_text())["text_config"]
    hf = load_file(tiny_35 / "model.safetensors")
    la = "model.language_model.layers.0.linear_attn."
    layer = Qwen3_5MoeGatedDeltaNet(Qwen3_5MoeTextConfig(**c), 0).float()
    layer.load_state_dict({k.removeprefix(la): w.float() for k, w in hf.items()
                           if k.startswith(la)})
    x = torch.randn(1, 6, c["hidden_size"], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = layer(x)[0].double().numpy()
    nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    r, eps, x64 = nv // nk, c["rms_norm_eps"], x[0].double().numpy()
    arrays = converted_35["f32"][1]
    gguf_t = {k.removeprefix("blk.0."): a.astype(np.float64) for k, a in arrays.items()
              if k.startswith("blk.0.")}
    tiled = _deltanet(gguf_t, x64, lambda h: h % nk, eps)  # llama.cpp's ggml_repeat broadcast
    np.testing.assert_allclose(tiled, want, rtol=0, atol=2e-5 * np.abs(want).max())
    # the reference itself is the HF layer on the HF order (value head j reads key head j // r)
    names = {"attn_qkv.weight": "in_proj_qkv.weight", "attn_gate.weight": "in_proj_z.weight",
             "ssm_beta.weight": "in_proj_b.weight", "ssm_alpha.weight": "in_proj_a.weight",
             "ssm_dt.bias": "dt_bias", "ssm_out.weight": "out_proj.weight"}
    hf_t = gguf_t | {k: hf[la + n].double().numpy() for k, n in names.items()} | {
        "ssm_conv1d.weight": hf[la + "conv1d.weight"][:, 0].double().numpy(),
        "ssm_a": -hf[la + "A_log"].double().exp().numpy()}
    grouped = _deltanet(hf_t, x64, lambda h: h // r, eps)
    np.testing.assert_allclose(grouped, want, rtol=0, atol=2e-5 * np.abs(want).max())
    assert np.abs(_deltanet(hf_t, x64, lambda h: h % nk, eps) - want).max() > 1e-2 * np.abs(
        want).max()  # without the reorder the tiled broadcast pairs the wrong heads


@pytest.mark.parametrize(("change", "message"), [
    ({"attn_output_gate": False}, "attn_output_gate=false: llama.cpp's qwen35moe"),
    ({"linear_num_value_heads": 3}, "linear_num_value_heads 3 is not a multiple"),
    ({"layer_types": ["full_attention"] * 4}, "layer_types is not the full_attention_interval"),
])
def test_unmappable_qwen3_5_configs_are_refused(tiny_35: Path, tmp_path: Path, change: dict,
                                               message: str) -> None:
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).symlink_to(tiny_35 / name)
    config = json.loads((tiny_35 / "config.json").read_text())
    config["text_config"] |= change
    (tmp_path / "config.json").write_text(json.dumps(config))
    res = subprocess.run([str(GGUF_PYTHON), str(CONVERT), str(tmp_path), str(tmp_path / "o.gguf")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and message in res.stderr, res.stderr
    assert not (tmp_path / "o.gguf").exists()


@pytest.fixture(scope="module")
def tiny_glm() -> Path:
    return cached_tiny("glm4_moe", "tiny")


@pytest.fixture(scope="module")
def converted_glm(tiny_glm: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("gguf_glm")
    return {t: _convert(tiny_glm, root / t, t) for t in ("f32", "bf16")}


# Every non-default routing / attention setting at once: q/k norms, 4 groups of 4 experts of which
# the best 2 are kept, a routed scale, no renormalisation.
_GLM_VARIANT = {"use_qk_norm": True, "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5,
                "norm_topk_prob": False}


@pytest.fixture(scope="module")
def glm_variant(tiny_glm: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny glm4_moe with :data:`_GLM_VARIANT`, q/k norm weights and the start of a released
    checkpoint's MTP layer (``model.layers.4.``, num_nextn_predict_layers 1)."""
    root = tmp_path_factory.mktemp("glm_variant")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (root / name).symlink_to(tiny_glm / name)
    config = json.loads((tiny_glm / "config.json").read_text()) | _GLM_VARIANT
    (root / "config.json").write_text(json.dumps(config))
    tensors = load_file(tiny_glm / "model.safetensors")
    g, h, d = torch.Generator().manual_seed(0), config["hidden_size"], config["head_dim"]
    for i in range(config["num_hidden_layers"]):
        for norm in ("q_norm", "k_norm"):
            tensors[f"model.layers.{i}.self_attn.{norm}.weight"] = (
                1 + 0.3 * torch.randn(d, generator=g)).to(torch.bfloat16)
    tensors |= {"model.layers.4.eh_proj.weight": torch.zeros(h, 2 * h, dtype=torch.bfloat16),
                "model.layers.4.enorm.weight": torch.ones(h, dtype=torch.bfloat16),
                "model.layers.4.mlp.gate.weight": torch.zeros(16, h, dtype=torch.bfloat16)}
    save_file(tensors, root / "model.safetensors")
    return root


def _expected_tensors_glm(c: dict) -> dict[str, list[int]]:
    """Name -> ggml ne of every tensor llama.cpp's glm4moe ``load_arch_tensors`` creates (separate
    q/k/v with biases, q/k norms only with use_qk_norm; no nextn block)."""
    h, v, e, f = c["hidden_size"], c["vocab_size"], c["n_routed_experts"], c["intermediate_size"]
    d, nq, nkv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    fe = c["moe_intermediate_size"]
    fs = fe * c["n_shared_experts"]
    out = {"token_embd.weight": [h, v], "output_norm.weight": [h], "output.weight": [h, v]}
    for i in range(c["num_hidden_layers"]):
        b = f"blk.{i}."
        out |= {b + "attn_norm.weight": [h], b + "attn_q.weight": [h, nq * d],
                b + "attn_q.bias": [nq * d], b + "attn_k.weight": [h, nkv * d],
                b + "attn_k.bias": [nkv * d], b + "attn_v.weight": [h, nkv * d],
                b + "attn_v.bias": [nkv * d], b + "attn_output.weight": [nq * d, h],
                b + "post_attention_norm.weight": [h]}
        if c["use_qk_norm"]:
            out |= {b + "attn_q_norm.weight": [d], b + "attn_k_norm.weight": [d]}
        if i < c["first_k_dense_replace"]:
            out |= {b + "ffn_gate.weight": [h, f], b + "ffn_up.weight": [h, f],
                    b + "ffn_down.weight": [f, h]}
        else:
            out |= {b + "ffn_gate_inp.weight": [h, e], b + "exp_probs_b.bias": [e],
                    b + "ffn_gate_exps.weight": [h, fe, e], b + "ffn_up_exps.weight": [h, fe, e],
                    b + "ffn_down_exps.weight": [fe, h, e], b + "ffn_gate_shexp.weight": [h, fs],
                    b + "ffn_up_shexp.weight": [h, fs], b + "ffn_down_shexp.weight": [fs, h]}
    return out


def _glm_keys(meta: dict) -> dict:
    kv = meta["meta"]
    assert kv["general.architecture"] == "glm4moe"
    return {k.removeprefix("glm4moe."): kv[k] for k in kv if k.startswith("glm4moe.")}


def test_glm4_moe_tensors_and_keys_are_what_llama_cpp_glm4moe_loads(tiny_glm: Path,
                                                                   converted_glm: dict) -> None:
    c = json.loads((tiny_glm / "config.json").read_text())
    meta, _ = converted_glm["f32"]
    assert {k: v[0] for k, v in meta["tensors"].items()} == _expected_tensors_glm(c)
    assert _glm_keys(meta) == {
        "block_count": 4, "context_length": 131072, "embedding_length": 256,
        "feed_forward_length": 512, "attention.head_count": 4, "attention.head_count_kv": 2,
        "attention.key_length": 64, "attention.value_length": 64, "rope.freq_base": 1e6,
        "attention.layer_norm_rms_epsilon": pytest.approx(1e-5), "rope.dimension_count": 32,
        "expert_count": 16, "expert_used_count": 4, "expert_feed_forward_length": 128,
        "expert_shared_count": 1, "leading_dense_block_count": 1, "expert_gating_func": 2,
        "expert_weights_norm": True, "expert_weights_scale": 1.0}
    kv = meta["meta"]  # <|endoftext|> 8192 ends text and pads; <|user|>, <|observation|> turns
    assert [kv[f"tokenizer.ggml.{k}"] for k in ("pre", "eos_token_id", "eot_token_id",
                                                "eom_token_id", "padding_token_id")] == [
        "qwen2", 8192, 8199, 8201, 8192]
    assert c["eos_token_id"] == [8192, 8199, 8201]
    types = {k: v[1] for k, v in converted_glm["bf16"][0]["tensors"].items()}
    assert (types["blk.1.ffn_gate_inp.weight"] == types["blk.1.exp_probs_b.bias"]
            == types["blk.0.attn_q.bias"] == "F32")
    assert types["blk.0.ffn_gate.weight"] == types["blk.1.ffn_up_exps.weight"] == "BF16"
    f32, bf16 = converted_glm["f32"][1], converted_glm["bf16"][1]
    assert all(np.array_equal(x, bf16[name]) for name, x in f32.items())  # exact for bf16 weights


def test_glm4_moe_tensors_are_copied_as_stored(tiny_glm: Path, converted_glm: dict) -> None:
    hf = {k: t.float().numpy() for k, t in load_file(tiny_glm / "model.safetensors").items()}
    arrays, m = converted_glm["f32"][1], "model.layers."
    pairs = {"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight",
             "output_norm.weight": "model.norm.weight",  # plain w * rms: no +1
             "blk.0.attn_norm.weight": m + "0.input_layernorm.weight",
             "blk.2.post_attention_norm.weight": m + "2.post_attention_layernorm.weight",
             "blk.2.attn_q.bias": m + "2.self_attn.q_proj.bias",
             "blk.2.attn_v.bias": m + "2.self_attn.v_proj.bias",
             "blk.3.attn_k.weight": m + "3.self_attn.k_proj.weight",
             "blk.0.ffn_down.weight": m + "0.mlp.down_proj.weight",
             "blk.1.ffn_gate_inp.weight": m + "1.mlp.gate.weight",
             "blk.1.exp_probs_b.bias": m + "1.mlp.gate.e_score_correction_bias",
             "blk.3.ffn_gate_shexp.weight": m + "3.mlp.shared_experts.gate_proj.weight",
             "blk.3.ffn_down_shexp.weight": m + "3.mlp.shared_experts.down_proj.weight"}
    for name, hf_name in pairs.items():
        np.testing.assert_array_equal(arrays[name], hf[hf_name], err_msg=name)
    for proj, kind in (("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
        np.testing.assert_array_equal(arrays[f"blk.2.{kind}.weight"], np.stack(
            [hf[f"{m}2.mlp.experts.{e}.{proj}.weight"] for e in range(16)]))
    assert np.abs(arrays["blk.1.exp_probs_b.bias"]).max() > 0  # a real bias, not zeros


def test_glm4_moe_variant_keys_qk_norms_and_mtp_left_out(glm_variant: Path,
                                                        tmp_path: Path) -> None:
    c = json.loads((glm_variant / "config.json").read_text())
    meta, arrays = _convert(glm_variant, tmp_path, "f32")
    assert {k: v[0] for k, v in meta["tensors"].items()} == _expected_tensors_glm(c)
    keys = _glm_keys(meta)
    assert {k: keys[k] for k in ("block_count", "expert_weights_norm", "expert_weights_scale",
                                 "expert_group_count", "expert_group_used_count")} == {
        "block_count": 4, "expert_weights_norm": False, "expert_weights_scale": 2.5,
        "expert_group_count": 4, "expert_group_used_count": 2}
    assert "glm4moe.nextn_predict_layers" not in meta["meta"]  # llama.cpp expects no nextn
    hf = load_file(glm_variant / "model.safetensors")
    np.testing.assert_array_equal(arrays["blk.3.attn_k_norm.weight"],
                                  hf["model.layers.3.self_attn.k_norm.weight"].float().numpy())
    # a topk_group equal to n_group masks nothing: no group keys (llama.cpp asserts used < count)
    (tmp_path / "all").mkdir()
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "all" / name).symlink_to(glm_variant / name)
    (tmp_path / "all" / "config.json").write_text(json.dumps(c | {"topk_group": 4}))
    keys = _glm_keys(_convert(tmp_path / "all", tmp_path / "all", "f32")[0])
    assert "expert_group_count" not in keys and "expert_group_used_count" not in keys


def _moe_llama_cpp(t: dict, keys: dict, x: np.ndarray) -> np.ndarray:
    """llama.cpp's glm4moe FFN of a MoE layer (``build_moe_ffn`` + shared expert) in float64 from
    GGUF-named tensors ``t`` (numpy order) and the file's keys."""
    silu = lambda a: a / (1 + np.exp(-a))  # noqa: E731
    probs = 1 / (1 + np.exp(-(x @ t["ffn_gate_inp.weight"].T)))  # expert_gating_func sigmoid
    select = probs + t["exp_probs_b.bias"]
    if (groups := keys.get("expert_group_count", 0)) > 1:
        g = select.reshape(len(x), groups, -1)
        best = np.sort(g, axis=-1)[..., -2:].sum(-1)  # the two best per group
        keep = np.argsort(-best, axis=-1)[:, :keys["expert_group_used_count"]]
        masked = np.full_like(g, -np.inf)
        rows = np.arange(len(x))[:, None]
        masked[rows, keep] = g[rows, keep]
        select = masked.reshape(len(x), -1)
    ids = np.argsort(-select, axis=-1)[:, :keys["expert_used_count"]]
    w = np.take_along_axis(probs, ids, axis=-1)
    if keys["expert_weights_norm"]:
        w = w / np.maximum(w.sum(-1, keepdims=True), 6.103515625e-5)
    w = w * keys["expert_weights_scale"]
    out = (silu(x @ t["ffn_gate_shexp.weight"].T) * (x @ t["ffn_up_shexp.weight"].T)
           ) @ t["ffn_down_shexp.weight"].T
    for n in range(len(x)):
        for j, e in enumerate(ids[n]):
            act = silu(t["ffn_gate_exps.weight"][e] @ x[n]) * (t["ffn_up_exps.weight"][e] @ x[n])
            out[n] += w[n, j] * (t["ffn_down_exps.weight"][e] @ act)
    return out


def test_glm4_moe_routing_from_the_gguf_equals_the_hf_moe_block(glm_variant: Path,
                                                                tmp_path: Path) -> None:
    c = json.loads((glm_variant / "config.json").read_text())
    hf = load_file(glm_variant / "model.safetensors")
    m = "model.layers.1.mlp."
    block = Glm4MoeMoE(Glm4MoeConfig(**c)).float()
    with torch.no_grad():
        block.gate.weight.copy_(hf[m + "gate.weight"].float())
        block.gate.e_score_correction_bias.copy_(hf[m + "gate.e_score_correction_bias"].float())
        block.experts.gate_up_proj.copy_(torch.stack([torch.cat(
            [hf[f"{m}experts.{e}.{p}.weight"].float() for p in ("gate_proj", "up_proj")])
            for e in range(16)]))
        block.experts.down_proj.copy_(torch.stack(
            [hf[f"{m}experts.{e}.down_proj.weight"].float() for e in range(16)]))
        block.shared_experts.load_state_dict({k.removeprefix(m + "shared_experts."): w.float()
                                              for k, w in hf.items()
                                              if k.startswith(m + "shared_experts.")})
        x = torch.randn(1, 24, c["hidden_size"], generator=torch.Generator().manual_seed(0))
        want = block(x)[0].double().numpy()
    meta, arrays = _convert(glm_variant, tmp_path, "f32")
    keys = _glm_keys(meta)
    t = {k.removeprefix("blk.1."): a.astype(np.float64) for k, a in arrays.items()
         if k.startswith("blk.1.")}
    x64 = x[0].double().numpy()
    got = _moe_llama_cpp(t, keys, x64)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
    ungrouped = _moe_llama_cpp(t, {k: v for k, v in keys.items() if "group" not in k}, x64)
    assert np.abs(ungrouped - want).max() > 1e-2 * np.abs(want).max()  # the groups do matter


@pytest.mark.parametrize(("change", "message"), [
    ({"n_shared_experts": 0}, "n_shared_experts < 1: llama.cpp's glm4moe always adds"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu': llama.cpp's glm4moe is silu"),
    ({"n_group": 3}, "n_routed_experts 16 does not split into n_group 3 groups"),
    ({"topk_group": 2}, "topk_group 2 is not in 1..n_group (1)"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope scaling {'rope_type': 'yarn'"),
    ({"use_qk_norm": True}, "checkpoint lacks 8 tensors, e.g. ['model.layers.0.self_attn.k_norm"),
    ({"num_nextn_predict_layers": 0}, "3 checkpoint tensors have no GGUF mapping: "
                                      "['model.layers.4.eh_proj.weight'"),
])
def test_unmappable_glm4_moe_configs_are_refused(glm_variant: Path, tiny_glm: Path,
                                                 tmp_path: Path, change: dict,
                                                 message: str) -> None:
    src = glm_variant if "num_nextn_predict_layers" in change else tiny_glm
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).symlink_to(src / name)
    config = json.loads((src / "config.json").read_text()) | change
    (tmp_path / "config.json").write_text(json.dumps(config))
    res = subprocess.run([str(GGUF_PYTHON), str(CONVERT), str(tmp_path), str(tmp_path / "o.gguf")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and message in res.stderr, res.stderr
    assert not (tmp_path / "o.gguf").exists()
