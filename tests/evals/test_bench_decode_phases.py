"""The decode-step breakdown (evals/bench_decode_phases.py) on the tiny hybrid checkpoint: every
op of the step is counted once per layer and its bytes are what the checkpoint's shapes say."""

from __future__ import annotations

import argparse
import json

import pytest

from evals.bench_decode_phases import _cases, main


def test_breakdown_counts_every_op_and_its_bytes(tiny_checkpoint, tmp_path) -> None:
    path = tiny_checkpoint("qwen3_next")
    config = json.loads((path / "config.json").read_text())
    out = tmp_path / "phases.json"
    assert main(["--model", str(path), "--cases", "2x20,1x5", "--repeats", "2",
                 "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    H, L = config["hidden_size"], config["num_hidden_layers"]
    attn_layers = L // config["full_attention_interval"]
    nh, nkv, hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    hk, hv = config["linear_num_key_heads"], config["linear_num_value_heads"]
    dk, dv, K = (config["linear_key_head_dim"], config["linear_value_head_dim"],
                 config["linear_conv_kernel_dim"])
    width = 2  # the checkpoint is bf16 and serve computes in its dtype
    assert result["read_gbps"] > 0
    assert [(c["batch"], c["context"]) for c in result["cases"]] == [(2, 20), (1, 5)]
    for case in result["cases"]:
        B, C = case["batch"], case["context"]
        phases = {p["name"]: p for p in case["phases"]}
        assert {n: p["calls"] for n, p in phases.items()} == {
            "attention": attn_layers, "gdn": L - attn_layers, "moe": L, "lm_head": 1}
        qkv = (2 * nh * hd + 2 * nkv * hd) * H  # gated q: q and gate rows
        kv = 2 * B * (C + 1) * nkv * hd * width
        assert phases["attention"]["bytes"] == attn_layers * ((qkv + H * nh * hd) * width + kv)
        conv_dim = 2 * hk * dk + hv * dv
        gdn_weights = ((conv_dim + hv * dv + 2 * hv) * H + conv_dim * K + H * hv * dv) * width
        states = B * (hv * dk * dv * 4 + conv_dim * (K - 1) * width)
        assert phases["gdn"]["bytes"] == (L - attn_layers) * (gdn_weights + 2 * states)
        assert phases["lm_head"]["bytes"] == config["vocab_size"] * H * width
        top_k, E = config["num_experts_per_tok"], config["num_experts"]
        assert top_k <= case["distinct_experts"] <= min(E, B * top_k)
        assert case["bytes"] == sum(p["bytes"] for p in case["phases"])
        assert case["bound_ms"] == pytest.approx(case["bytes"] / result["read_gbps"] / 1e6)
        assert case["step_ms"] > 0 and all(p["ms"] > 0 for p in case["phases"])


@pytest.mark.parametrize("text", ["", "1x", "9x16", "0x16", "2x0", "1x16,b"])
def test_bad_cases_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="1x16,8x512|BxC"):
        _cases(text)
