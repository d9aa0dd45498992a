"""Fixtures of the packed-format tests: tiny checkpoints of every family and expert format, each
with its packed form (``freetoken convert``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from freetoken.models.tiny import make_tiny
from freetoken.models.tiny_fp8 import quantize_blocks
from freetoken.packed.convert import convert

# (name, arch, make_tiny keywords): every family, and every expert format the banks hold
VARIANTS = (
    ("qwen3_moe-bf16", "qwen3_moe", {}),
    ("qwen3_next-bf16", "qwen3_next", {}),
    ("qwen3_5_moe-bf16", "qwen3_5_moe", {}),
    ("glm4_moe-bf16", "glm4_moe", {}),
    ("gpt_oss-mxfp4", "gpt_oss", {}),
    ("gpt_oss-bf16", "gpt_oss", {"expert_format": "bf16"}),
    ("qwen3_5_moe-fp8", "qwen3_5_moe", {"weights": "fp8"}),
    ("glm4_moe-fp8", "glm4_moe", {"weights": "fp8"}),
    ("qwen3_moe-nvfp4", "qwen3_moe", {"weights": "nvfp4"}),
    ("qwen3_next-nvfp4", "qwen3_next", {"weights": "nvfp4"}),
    ("qwen3_5_moe-fused-fp8", "qwen3_5_moe", {}),  # dense fp32 banks (blocks straddle gate/up)
)


def fuse_fp8(path: Path) -> None:
    """Turn one MoE layer's fused bf16 experts of a qwen3_5_moe checkpoint into FP8 with 128 x 128
    blocks (whose rows straddle gate and up: the banks stay dense, in fp32)."""
    tensors = load_file(path / "model.safetensors")
    name = "model.language_model.layers.1.mlp.experts.gate_up_proj"
    tensors[name], tensors[name + "_scale_inv"] = quantize_blocks(tensors[name], (128, 128))
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture(scope="session")
def packed_pair(tmp_path_factory: pytest.TempPathFactory):
    """``packed_pair(variant) -> (src, dst)``: the tiny checkpoint and its packed form, made once
    per session."""
    made: dict[str, tuple[Path, Path]] = {}
    specs = {name: (arch, kw) for name, arch, kw in VARIANTS}

    def get(variant: str) -> tuple[Path, Path]:
        if variant not in made:
            root = tmp_path_factory.mktemp(f"packed-{variant}")
            arch, kw = specs[variant]
            src = make_tiny(arch, "tiny", root / "src", **kw)
            if variant.endswith("fused-fp8"):
                fuse_fp8(src)
            convert(src, root / "dst")
            made[variant] = (src, root / "dst")
        return made[variant]

    return get


@pytest.fixture
def packed_copy(packed_pair, tmp_path: Path):
    """``packed_copy(variant) -> Path``: a copy of the packed checkpoint a test may damage."""

    def get(variant: str) -> Path:
        dst = tmp_path / "packed"
        shutil.copytree(packed_pair(variant)[1], dst)
        return dst

    return get
