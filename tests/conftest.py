"""Session-wide test helpers shared by every test folder."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

# transformers routes Qwen3-Next linear attention to flash-linear-attention's triton kernels when
# that package is importable, and those crash on CPU; with this it uses its torch fallback.
sys.modules["fla"] = None

# On a 2-CPU machine shared with other processes (CI runs agent clients next to the server), two
# OpenMP threads stall in every parallel region whenever the other core is busy: measured 10-20x
# slower model steps than one thread. One intra-op thread keeps the suite fast and steady.
if (os.cpu_count() or 1) <= 2:
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``tiny_checkpoint(arch) -> Path``: the seed-0 ``tiny`` checkpoint of ``arch``
    (``"qwen3_moe"`` or ``"qwen3_next"``), generated once per test session."""
    from freetoken.models.tiny import make_tiny

    root = tmp_path_factory.mktemp("tiny-checkpoints")
    made: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in made:
            made[arch] = make_tiny(arch, "tiny", root / arch, seed=0)
        return made[arch]

    return get
