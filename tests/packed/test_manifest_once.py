"""A packed manifest read once at start is passed along: the memory plan and the loader (with
the raw-experts re-read of a quantised release) use it and do not read the manifest again."""

from __future__ import annotations

import pytest
import torch

import freetoken.packed.manifest as manifest_module
from freetoken.engine.memory_plan import checkpoint_weight_bytes
from freetoken.models.registry import load_model
from freetoken.offload.backend import MoeConfig
from freetoken.offload.loading import planned_bank_dtype
from freetoken.packed.manifest import read_manifest


@pytest.fixture
def no_manifest_reads(monkeypatch):
    """From here on, reading any manifest fails the test."""

    def refuse(*_args):
        raise AssertionError("the manifest was read again")

    return lambda: monkeypatch.setattr(manifest_module, "_parse", refuse)


@pytest.mark.parametrize("variant", ["qwen3_moe-bf16", "qwen3_moe-nvfp4"])
def test_the_loader_and_the_plan_take_the_manifest_read_at_start(packed_pair, no_manifest_reads,
                                                                  variant) -> None:
    _, dst = packed_pair(variant)
    manifest = read_manifest(dst)
    sizes = checkpoint_weight_bytes(dst, 2)
    reference = load_model(dst, moe=MoeConfig(backend="offload", cache="2"))
    no_manifest_reads()
    assert checkpoint_weight_bytes(dst, 2, manifest) == sizes
    assert planned_bank_dtype(dst, "bfloat16", manifest) == "bfloat16"
    model = load_model(dst, moe=MoeConfig(backend="offload", cache="2"), packed=manifest)
    banks, expected = model.moe_runtime.banks, reference.moe_runtime.banks
    assert banks.format == expected.format
    for got, want in zip(_bank_tensors(banks), _bank_tensors(expected), strict=True):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def _bank_tensors(banks):
    if banks.view is None:
        return (banks.gate_up, banks.down)
    return banks.view.gate_up + banks.view.down
