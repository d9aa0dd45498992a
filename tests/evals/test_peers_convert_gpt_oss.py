"""``evals/peers/convert_gguf.py`` on the tiny gpt_oss checkpoints (MXFP4 and bf16 experts): the
GGUF holds the tensors, types and keys llama.cpp's ``gpt-oss`` loader asks for; the MXFP4 experts
repacked into ggml's ``block_mxfp4`` decode to exactly the released values; a MoE block computed
from the GGUF tensors the way llama.cpp's graph does equals transformers' ``GptOssMLP``; and what
llama.cpp's graph cannot run is refused.

The repacking tests (``mxfp4_np.py`` against FreeToken's MXFP4 decoder and a ggml-layout decoder
written here from ``ggml-common.h`` / ``ggml-quants.c``) need numpy and torch only and always
run. The converter tests need the ``gguf`` package of the peer venv
(``evals/peers/build_llamacpp_tools.sh``, or ``FREETOKEN_GGUF_PYTHON``), run there as a
subprocess, and are skipped without it. llama.cpp itself is checked end to end by
``parity_llamacpp.py`` (``evals/peers/README.md``). Run:
``.venv/bin/pytest tests/evals/test_peers_convert_gpt_oss.py`` (about 20 s).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers.models.gpt_oss.configuration_gpt_oss import GptOssConfig
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

from freetoken.models.tiny import cached_tiny, make_tiny
from freetoken.ops.cpu_moe.quant import dequantize_mxfp4, quantize_mxfp4

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "evals" / "peers"))

import mxfp4_np  # noqa: E402

CONVERT = REPO / "evals" / "peers" / "convert_gguf.py"
_CACHE = Path(os.environ.get("FREETOKEN_CACHE", Path.home() / ".cache" / "freetoken"))
GGUF_PYTHON = Path(os.environ.get(
    "FREETOKEN_GGUF_PYTHON",
    _CACHE / "peers" / "llamacpp-tools-0.3.36" / "gguf-0.19.0-venv" / "bin" / "python"))
DEFAULT_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 4096}  # the releases'
needs_gguf = pytest.mark.skipif(not GGUF_PYTHON.is_file(), reason=f"no gguf python at "
                                f"{GGUF_PYTHON} (build_llamacpp_tools.sh)")

# Reads a GGUF back with gguf's own reader into metadata.json + tensors.npz (float32, numpy
# order; block-quantised tensors decoded by gguf.quants.dequantize, their bytes kept as
# "<name>/bytes").
_DUMP = """
import json, sys, numpy as np, gguf
from gguf.quants import dequantize
r = gguf.GGUFReader(sys.argv[1])
meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.")}
info, arrays = {}, {}
for t in r.tensors:
    shape = [int(n) for n in t.shape][::-1]
    info[t.name] = [[int(n) for n in t.shape], t.tensor_type.name]
    data = np.asarray(t.data)
    if t.tensor_type.name == "BF16":
        data = (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    elif t.tensor_type.name not in ("F32", "F16"):
        arrays[t.name + "/bytes"] = data.copy()
        data = dequantize(data, t.tensor_type)
    arrays[t.name] = data.astype(np.float32).reshape(shape)
json.dump({"meta": meta, "tensors": info}, open(sys.argv[2] + "/metadata.json", "w"))
np.savez(sys.argv[2] + "/tensors.npz", **arrays)
"""


def _ggml_dequantize(row_bytes: np.ndarray) -> np.ndarray:
    """ggml's ``dequantize_row_mxfp4`` of ``[..., nb * 17]`` bytes: per 17-byte block the E8M0
    byte e, then ``qs[j]`` with element j in its low nibble and j + 16 in its high one, value
    ``kvalues_mxfp4[code] * 2^(e - 128)`` (doubled E2M1 table, halved scale)."""
    kvalues = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)
    blocks = row_bytes.reshape(*row_bytes.shape[:-1], -1, 17)
    e, qs = blocks[..., 0].astype(np.int32), blocks[..., 1:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # elements 0..15, then 16..31
    values = np.ldexp(kvalues[codes], e[..., None] - 128)
    return values.reshape(*row_bytes.shape[:-1], -1)


def test_repacked_block_holds_element_j_and_j_plus_16_per_byte() -> None:
    codes = np.arange(32, dtype=np.uint8) % 16  # element k has code k % 16
    hf_block = (codes[0::2] | (codes[1::2] << 4))[None]  # byte j: elements 2j, 2j + 1
    out = mxfp4_np.repack_mxfp4(hf_block, np.array([130], np.uint8))
    assert out.tolist() == [130] + [j | (j << 4) for j in range(16)]  # j and j + 16 share code j


def test_repacked_bytes_decode_like_ggml_to_the_released_values() -> None:
    g = np.random.default_rng(0)
    blocks = g.integers(0, 256, (3, 5, 4, 16), dtype=np.uint8)
    scales = g.integers(0, 255, (3, 5, 4), dtype=np.uint8)
    scales[0, 0, :2] = [0, 1]  # ggml's denormal halves 2^-128, 2^-127
    want = dequantize_mxfp4(torch.from_numpy(blocks), torch.from_numpy(scales)).numpy()
    repacked = mxfp4_np.repack_mxfp4(blocks, scales)
    assert repacked.shape == (3, 5, 4 * 17) and repacked.dtype == np.uint8
    np.testing.assert_array_equal(_ggml_dequantize(repacked), want)  # -0.0 == 0.0 here
    np.testing.assert_array_equal(mxfp4_np.dequantize_mxfp4(blocks, scales), want)


def test_freetoken_quantised_weights_survive_the_repack() -> None:
    w = torch.randn(4, 64, 96, generator=torch.Generator().manual_seed(0))
    blocks, scales = quantize_mxfp4(w)
    want = dequantize_mxfp4(blocks, scales).numpy()
    got = _ggml_dequantize(mxfp4_np.repack_mxfp4(blocks.numpy(), scales.numpy()))
    np.testing.assert_array_equal(got, want)


def _convert(model: Path, out_dir: Path, outtype: str | None = None) -> tuple[dict, dict, str]:
    """(metadata, arrays, converter stderr) of ``model`` converted at ``outtype``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "model.gguf"
    args = [str(GGUF_PYTHON), str(CONVERT), str(model), str(path)]
    res = subprocess.run(args + (["--outtype", outtype] if outtype else []), check=True,
                         capture_output=True, text=True, timeout=300)
    subprocess.run([str(GGUF_PYTHON), "-c", _DUMP, str(path), str(out_dir)], check=True,
                   capture_output=True, timeout=300)
    with np.load(out_dir / "tensors.npz") as z:
        arrays = {k: z[k] for k in z.files}
    return json.loads((out_dir / "metadata.json").read_text()), arrays, res.stderr


def _variant(src: Path, root: Path, change: dict, tensors: dict | None = None) -> Path:
    """A copy of checkpoint ``src`` in ``root`` with ``change`` merged into its config (and
    ``tensors`` as its weights when given)."""
    root.mkdir(parents=True, exist_ok=True)
    names = ["tokenizer.json", "tokenizer_config.json"] + ([] if tensors else ["model.safetensors"])
    for name in names:
        (root / name).symlink_to(src / name)
    if tensors is not None:
        save_file(tensors, root / "model.safetensors")
    config = json.loads((src / "config.json").read_text()) | change
    (root / "config.json").write_text(json.dumps(config))
    return root


@pytest.fixture(scope="module")
def tiny_oss() -> Path:
    return cached_tiny("gpt_oss", "tiny")


@pytest.fixture(scope="module")
def tiny_oss_bf16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny("gpt_oss", "tiny", tmp_path_factory.mktemp("oss_bf16"), expert_format="bf16")


@pytest.fixture(scope="module")
def converted(tiny_oss: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    if not GGUF_PYTHON.is_file():
        pytest.skip(f"no gguf python at {GGUF_PYTHON}")
    root = tmp_path_factory.mktemp("gguf_oss")
    return {t or "default": _convert(tiny_oss, root / (t or "default"), t)
            for t in (None, "f32", "bf16")}


def _expected_tensors(c: dict) -> dict[str, list[int]]:
    """Name -> ggml ne of every tensor llama.cpp's openai-moe ``load_arch_tensors`` creates
    (q/k/v biases are optional there, present in gpt-oss)."""
    h, v, e, f = c["hidden_size"], c["vocab_size"], c["num_local_experts"], c["intermediate_size"]
    d, nq, nkv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    out = {"token_embd.weight": [h, v], "output_norm.weight": [h], "output.weight": [h, v]}
    for i in range(c["num_hidden_layers"]):
        b = f"blk.{i}."
        out |= {b + "attn_norm.weight": [h], b + "post_attention_norm.weight": [h],
                b + "attn_q.weight": [h, nq * d], b + "attn_q.bias": [nq * d],
                b + "attn_k.weight": [h, nkv * d], b + "attn_k.bias": [nkv * d],
                b + "attn_v.weight": [h, nkv * d], b + "attn_v.bias": [nkv * d],
                b + "attn_output.weight": [nq * d, h], b + "attn_output.bias": [h],
                b + "attn_sinks.weight": [nq], b + "ffn_gate_inp.weight": [h, e],
                b + "ffn_gate_inp.bias": [e], b + "ffn_gate_exps.weight": [h, f, e],
                b + "ffn_up_exps.weight": [h, f, e], b + "ffn_down_exps.weight": [f, h, e],
                b + "ffn_gate_exps.bias": [f, e], b + "ffn_up_exps.bias": [f, e],
                b + "ffn_down_exps.bias": [h, e]}
    return out


def _keys(meta: dict) -> dict:
    kv = meta["meta"]
    assert kv["general.architecture"] == "gpt-oss"
    return {k.removeprefix("gpt-oss."): kv[k] for k in kv if k.startswith("gpt-oss.")}


@needs_gguf
def test_tensors_types_and_keys_are_what_llama_cpp_gpt_oss_loads(tiny_oss: Path,
                                                                converted: dict) -> None:
    c = json.loads((tiny_oss / "config.json").read_text())
    meta, _, log = converted["default"]
    assert {k: v[0] for k, v in meta["tensors"].items()} == _expected_tensors(c)
    assert _keys(meta) == {
        "block_count": 4, "context_length": 131072, "embedding_length": 256,
        "feed_forward_length": 128, "attention.head_count": 4, "attention.head_count_kv": 2,
        "attention.key_length": 64, "attention.value_length": 64, "rope.freq_base": 150000.0,
        "attention.layer_norm_rms_epsilon": pytest.approx(1e-5), "expert_count": 16,
        "expert_used_count": 4, "expert_feed_forward_length": 128,
        "attention.sliding_window": 32,
        "attention.sliding_window_pattern": [True, False, True, False],
        "rope.scaling.type": "yarn", "rope.scaling.factor": 32.0,
        "rope.scaling.original_context_length": 4096}
    assert meta["meta"]["general.file_type"] == 38  # MOSTLY_MXFP4_MOE
    types = {k: v[1] for k, v in meta["tensors"].items()}
    for i in range(c["num_hidden_layers"]):
        assert {types[f"blk.{i}.ffn_{p}_exps.weight"] for p in ("gate", "up", "down")} == {"MXFP4"}
        assert {types[f"blk.{i}.ffn_{p}_exps.bias"] for p in ("gate", "up", "down")} == {"F32"}
    assert types["blk.0.attn_q.weight"] == types["token_embd.weight"] == "BF16"  # as stored
    assert types["blk.0.attn_sinks.weight"] == types["blk.0.ffn_gate_inp.weight"] == "F32"
    assert "truncate=false: llama.cpp rounds the correction range [8.093, 17.398] to [8, 18]" in log
    assert {v[1] for k, v in converted["f32"][0]["tensors"].items()} == {"F32"}


@needs_gguf
def test_experts_are_the_released_values_deinterleaved(tiny_oss: Path, converted: dict) -> None:
    hf = load_file(tiny_oss / "model.safetensors")
    mxfp4, f32, bf16 = (converted[t][1] for t in ("default", "f32", "bf16"))
    for i in range(4):
        m, b = f"model.layers.{i}.mlp.experts.", f"blk.{i}."
        gate_up = dequantize_mxfp4(hf[m + "gate_up_proj_blocks"], hf[m + "gate_up_proj_scales"])
        down = dequantize_mxfp4(hf[m + "down_proj_blocks"], hf[m + "down_proj_scales"])
        want = {"ffn_gate_exps.weight": gate_up[:, 0::2], "ffn_up_exps.weight": gate_up[:, 1::2],
                "ffn_down_exps.weight": down}
        bias = hf[m + "gate_up_proj_bias"].float()
        want |= {"ffn_gate_exps.bias": bias[:, 0::2], "ffn_up_exps.bias": bias[:, 1::2],
                 "ffn_down_exps.bias": hf[m + "down_proj_bias"].float()}
        for name, value in want.items():
            for arrays in (mxfp4, f32, bf16):  # mxfp4 decoded by gguf-py's ggml decoder
                np.testing.assert_array_equal(arrays[b + name], value.numpy(), err_msg=name)
        blocks = hf[m + "down_proj_blocks"].numpy()  # the bytes are the released ones, moved
        np.testing.assert_array_equal(
            mxfp4[b + "ffn_down_exps.weight/bytes"].reshape(-1),
            mxfp4_np.repack_mxfp4(blocks, hf[m + "down_proj_scales"].numpy()).reshape(-1))
    for name in ("blk.0.attn_sinks.weight", "blk.1.attn_q.weight", "blk.2.ffn_gate_inp.bias"):
        np.testing.assert_array_equal(mxfp4[name], f32[name])


@needs_gguf
def test_bf16_expert_layout_is_transposed_and_split(tiny_oss_bf16: Path, tmp_path: Path) -> None:
    hf = {k: t.float().numpy() for k, t in load_file(tiny_oss_bf16 / "model.safetensors").items()}
    meta, arrays, _ = _convert(tiny_oss_bf16, tmp_path)  # default: f32 (bf16 experts)
    assert {v[1] for v in meta["tensors"].values()} == {"F32"}
    m = "model.layers.3.mlp.experts."
    gate_up = hf[m + "gate_up_proj"]  # [E, H, 2I], [in, out]
    np.testing.assert_array_equal(arrays["blk.3.ffn_gate_exps.weight"],
                                  gate_up[:, :, 0::2].transpose(0, 2, 1))
    np.testing.assert_array_equal(arrays["blk.3.ffn_up_exps.weight"],
                                  gate_up[:, :, 1::2].transpose(0, 2, 1))
    np.testing.assert_array_equal(arrays["blk.3.ffn_down_exps.weight"],
                                  hf[m + "down_proj"].transpose(0, 2, 1))
    np.testing.assert_array_equal(arrays["blk.3.ffn_up_exps.bias"],
                                  hf[m + "gate_up_proj_bias"][:, 1::2])


def _moe_llama_cpp(t: dict, k: int, x: np.ndarray) -> np.ndarray:
    """llama.cpp's gpt-oss FFN (``build_moe_ffn`` with SOFTMAX_WEIGHT gating and SWIGLU_OAI_MOE,
    alpha 1.702 and limit 7 as hard-coded there) in float64 from GGUF-named tensors ``t``."""
    logits = x @ t["ffn_gate_inp.weight"].T + t["ffn_gate_inp.bias"]
    ids = np.argsort(-logits, axis=-1)[:, :k]
    top = np.take_along_axis(logits, ids, axis=-1)
    w = np.exp(top - top.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    for n in range(len(x)):
        for j, e in enumerate(ids[n]):
            g = np.minimum(t["ffn_gate_exps.weight"][e] @ x[n] + t["ffn_gate_exps.bias"][e], 7.0)
            u = np.clip(t["ffn_up_exps.weight"][e] @ x[n] + t["ffn_up_exps.bias"][e], -7.0, 7.0)
            act = g / (1 + np.exp(-1.702 * g)) * (u + 1)
            out[n] += w[n, j] * (t["ffn_down_exps.weight"][e] @ act + t["ffn_down_exps.bias"][e])
    return out


@needs_gguf
def test_moe_block_from_the_gguf_equals_the_hf_moe_block(tiny_oss_bf16: Path,
                                                        tmp_path: Path) -> None:
    c = json.loads((tiny_oss_bf16 / "config.json").read_text())
    hf = load_file(tiny_oss_bf16 / "model.safetensors")
    m = "model.layers.2.mlp."
    block = GptOssMLP(GptOssConfig(**c)).float()
    with torch.no_grad():
        block.load_state_dict({k.removeprefix(m): w.float() for k, w in hf.items()
                               if k.startswith(m)})
        # a wide input, so that some gate / up values pass the clamps at +-7
        x = 8 * torch.randn(1, 24, c["hidden_size"], generator=torch.Generator().manual_seed(0))
        want = block(x)[0][0].double().numpy()
    _, arrays, _ = _convert(tiny_oss_bf16, tmp_path, "f32")
    t = {k.removeprefix("blk.2."): a.astype(np.float64) for k, a in arrays.items()
         if k.startswith("blk.2.")}
    got = _moe_llama_cpp(t, 4, x[0].double().numpy())
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


@needs_gguf
def test_layer_types_rope_and_tied_variants(tiny_oss: Path, tmp_path: Path) -> None:
    mixed = _variant(tiny_oss, tmp_path / "mixed", {
        "layer_types": ["full_attention", "sliding_attention", "sliding_attention",
                        "full_attention"],
        "rope_scaling": DEFAULT_ROPE | {"truncate": True, "attention_factor": 1.5}})
    meta, _, log = _convert(mixed, tmp_path / "mixed_out")
    keys = _keys(meta)
    assert keys["attention.sliding_window_pattern"] == [False, True, True, False]
    assert keys["rope.scaling.attn_factor"] == pytest.approx(1.5 / (0.1 * math.log(32) + 1))
    assert "note:" not in log  # truncate: true is reproduced
    plain = _variant(tiny_oss, tmp_path / "plain", {"rope_scaling": None})
    keys = _keys(_convert(plain, tmp_path / "plain_out")[0])
    assert not any(k.startswith("rope.scaling.") for k in keys)
    tensors = load_file(tiny_oss / "model.safetensors")
    del tensors["lm_head.weight"]
    tied = _variant(tiny_oss, tmp_path / "tied", {"tie_word_embeddings": True}, tensors)
    _, arrays, _ = _convert(tied, tmp_path / "tied_out")
    np.testing.assert_array_equal(arrays["output.weight"], arrays["token_embd.weight"])


@needs_gguf
@pytest.mark.parametrize(("change", "message"), [
    ({"swiglu_limit": 6.0}, "swiglu_limit 6.0: llama.cpp's gpt-oss hard-codes 7"),
    ({"swiglu_alpha": 1.5}, "swiglu_alpha 1.5: llama.cpp's gpt-oss hard-codes 1.702"),
    ({"rope_scaling": DEFAULT_ROPE | {"beta_fast": 16.0}}, "yarn beta_fast 16.0: llama.cpp's"),
    ({"rope_scaling": DEFAULT_ROPE | {"mscale": 1.0}}, "yarn mscale / mscale_all_dim"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_type 'linear'"),
    ({"attention_bias": False}, "attention_bias=false: llama.cpp's gpt-oss loader requires"),
    ({"layer_types": ["sliding_attention"] * 3}, "layer_types must list 4 entries"),
])
def test_what_llama_cpp_cannot_run_is_refused(tiny_oss: Path, tmp_path: Path, change: dict,
                                              message: str) -> None:
    src = _variant(tiny_oss, tmp_path / "src", change)
    res = subprocess.run([str(GGUF_PYTHON), str(CONVERT), str(src), str(tmp_path / "o.gguf")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and message in res.stderr, res.stderr
    assert not (tmp_path / "o.gguf").exists()


@needs_gguf
def test_mxfp4_outtype_needs_mxfp4_experts(tiny_oss_bf16: Path, tmp_path: Path) -> None:
    res = subprocess.run([str(GGUF_PYTHON), str(CONVERT), str(tiny_oss_bf16),
                          str(tmp_path / "o.gguf"), "--outtype", "mxfp4"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "--outtype mxfp4 needs MXFP4 experts" in res.stderr
