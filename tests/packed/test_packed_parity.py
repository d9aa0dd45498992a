"""A packed checkpoint loads the same model as its safetensors source: greedy tokens equal on
every family and expert format, resident and offloaded, in fp32 and bf16; every expert tensor
equal where the experts are dense parameters (the per-layer staging path, dequantising)."""

from __future__ import annotations

import json

import pytest
import torch

from freetoken.models.config import ModelConfig
from freetoken.models.loader import Checkpoint, load_weights
from freetoken.models.registry import MODEL_CLASSES, load_model, with_modelopt_config
from freetoken.offload.backend import MoeConfig
from freetoken.packed.load import load_checkpoint
from tests.models.conftest import prompt_ids
from tests.packed.conftest import VARIANTS

NAMES = [name for name, _, _ in VARIANTS]
BACKENDS = {"resident": None, "cpu": MoeConfig(backend="cpu"),
            "offload": MoeConfig(backend="offload", cache="2")}


def greedy(model, path, steps: int = 8) -> torch.Tensor:
    """``[steps]`` greedy tokens after a 24-token chat prompt."""
    state, out = model.new_state(), []
    logits = model(prompt_ids(path, 24), state)
    for _ in range(steps):
        out.append(int(logits.argmax()))
        logits = model(torch.tensor(out[-1:]), state)
    return torch.tensor(out)


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("variant", NAMES)
def test_greedy_tokens_equal_the_safetensors_load(packed_pair, variant, backend) -> None:
    src, dst = packed_pair(variant)
    dtype = torch.bfloat16 if backend == "cpu" else torch.float32
    moe = BACKENDS[backend]
    packed = load_model(dst, dtype=dtype, moe=moe)
    assert torch.equal(greedy(packed, dst), greedy(load_model(src, dtype=dtype, moe=moe), src))


@pytest.mark.parametrize("variant", ["qwen3_moe-bf16", "gpt_oss-bf16"])
def test_quantised_at_load_banks_equal_too(packed_pair, variant) -> None:
    """``--moe-expert-format q4g`` quantises the packed dense banks as it does the loaded ones."""
    src, dst = packed_pair(variant)
    moe = MoeConfig(backend="cpu", expert_format="q4g")
    assert torch.equal(greedy(load_model(dst, moe=moe), dst),
                       greedy(load_model(src, moe=moe), src))


def _dense_model(path, dtype):
    raw = json.loads((path / "config.json").read_text())
    config = ModelConfig.from_hf(with_modelopt_config(path, raw))
    return config, MODEL_CLASSES[raw["architectures"][0]](config, dtype=dtype, device="cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("variant", NAMES)
def test_dense_parameters_from_packed_banks_are_bitwise_equal(packed_pair, variant,
                                                              dtype) -> None:
    """Dense resident experts (a GPU's resident backend) from the packed banks: cast, or
    dequantised from MXFP4 / NVFP4 / FP8 banks, equal to the safetensors loader's bit for bit."""
    src, dst = packed_pair(variant)
    config, ref = _dense_model(src, dtype)
    load_weights(Checkpoint.for_config(src, config), ref.weight_targets())
    _, model = _dense_model(dst, dtype)
    load_checkpoint(Checkpoint.for_config(dst, config), model.weight_targets())
    expected = ref.state_dict()
    for name, value in model.state_dict().items():
        assert torch.equal(value, expected[name]), name
