"""Tests of the project-side pieces of the llama.cpp recipe that need neither llama.cpp nor the
``gguf`` package: the numpy safetensors reader and the GGUF vocabulary builder.

Run: ``.venv/bin/pytest tests/evals/test_peers.py`` (about 5 s; makes the tiny qwen3_moe
checkpoint on first use). The GGUF writer and llama.cpp itself are checked end to end by
``compare_llamacpp.sh`` (``parity_llamacpp.py``: identical tokenisation and greedy tokens).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "evals" / "peers"))

from gguf_vocab import CONTROL, NORMAL, QWEN2_SPLIT_REGEX, UNUSED, USER_DEFINED, load_vocab  # noqa: E402
from safetensors_np import SafetensorsCheckpoint  # noqa: E402

from freetoken.models.tiny import cached_tiny  # noqa: E402
from freetoken.tokenizer.tokenizer import Tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def tiny() -> Path:
    return cached_tiny("qwen3_moe", "tiny")


def test_reader_is_bit_exact_for_bf16_f16_f32(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    tensors = {"a": torch.randn(3, 5, generator=g).to(torch.bfloat16),
               "b": torch.randn(7, generator=g).to(torch.float16),
               "c": torch.randn(2, 2, 2, generator=g)}
    save_file(tensors, tmp_path / "model.safetensors")
    ckpt = SafetensorsCheckpoint(tmp_path)
    assert ckpt.names() == ["a", "b", "c"]
    assert [ckpt.dtype_tag(n) for n in "abc"] == ["BF16", "F16", "F32"]
    for name, t in tensors.items():
        assert ckpt.shape(name) == tuple(t.shape)
        assert np.array_equal(ckpt.float32(name), t.float().numpy())
    assert np.array_equal(ckpt.raw("a"), tensors["a"].view(torch.int16).numpy().view(np.uint16))


def test_reader_reads_every_tensor_of_the_tiny_checkpoint(tiny: Path) -> None:
    ref = load_file(tiny / "model.safetensors")
    ckpt = SafetensorsCheckpoint(tiny)
    assert ckpt.names() == sorted(ref)
    name = "model.layers.1.mlp.experts.3.down_proj.weight"
    assert np.array_equal(ckpt.float32(name), ref[name].float().numpy())


def test_reader_rejects_missing_weights(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="neither model.safetensors nor"):
        SafetensorsCheckpoint(tmp_path)


def test_vocab_matches_the_project_tokenizer(tiny: Path) -> None:
    config = json.loads((tiny / "config.json").read_text())
    v = load_vocab(tiny, config["vocab_size"], config["bos_token_id"])
    tok = json.loads((tiny / "tokenizer.json").read_text())
    assert len(v.tokens) == len(v.token_types) == config["vocab_size"] == 8256
    assert v.pre == "qwen2"
    assert (v.bos_id, v.eos_id, v.pad_id) == (8192, 8194, 8192)
    assert v.tokens[8194] == "<|im_end|>" and v.token_types[8194] == CONTROL
    assert v.token_types[8192] == CONTROL
    think = Tokenizer.from_pretrained(tiny).encode("<think>")
    assert len(think) == 1 and v.tokens[think[0]] == "<think>"
    assert v.token_types[think[0]] == USER_DEFINED
    assert v.tokens[8255] == "[PAD8255]" and v.token_types[8255] == UNUSED
    assert v.token_types[:8192] == [NORMAL] * 8192
    for text, idx in tok["model"]["vocab"].items():
        assert v.tokens[idx] == text
    assert len(v.merges) == len(tok["model"]["merges"])
    assert v.merges[0] == " ".join(tok["model"]["merges"][0])
    assert v.chat_template == json.loads((tiny / "tokenizer_config.json").read_text())["chat_template"]


def test_vocab_refuses_a_pre_tokenizer_llama_cpp_would_split_differently(tiny: Path,
                                                                          tmp_path: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((tiny / name).read_bytes())
    data = json.loads((tmp_path / "tokenizer.json").read_text())
    assert data["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == QWEN2_SPLIT_REGEX
    data["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\p{N}{1,3}|\s+"
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"has no known llama.cpp pre-tokenizer"):
        load_vocab(tmp_path, 8256, 8192)


def test_vocab_refuses_ids_beyond_the_embedding(tiny: Path) -> None:
    with pytest.raises(ValueError, match=r"outside vocab_size 8200"):
        load_vocab(tiny, 8200, 8192)
