"""Fixtures of the model tests: FreeToken and transformers models of the tiny checkpoints."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
sys.modules["fla"] = None  # see tests/conftest.py

ARCHES = ("qwen3_moe", "qwen3_next", "qwen3_5_moe", "glm4_moe", "gpt_oss")
PROMPT_TEXT = (
    "<|im_start|>system\nYou are a coding assistant.<|im_end|>\n<|im_start|>user\n"
    "Write a Python function that parses a CSV file and returns the rows as dicts, "
    "skipping blank lines and stripping whitespace from every field.<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def load_hf(path: Path) -> torch.nn.Module:
    """The checkpoint as transformers' fp32 ``AutoModelForCausalLM`` (the parity oracle); its
    eager attention, the one that applies gpt-oss's sinks."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                attn_implementation="eager").eval()


def prompt_ids(path: Path, length: int) -> torch.Tensor:
    """``[length]`` int64 ids: the chat prompt above tokenized, repeated to ``length`` tokens."""
    from freetoken.tokenizer.tokenizer import Tokenizer

    ids = Tokenizer.from_pretrained(path).encode(PROMPT_TEXT)
    return torch.tensor((ids * (length // len(ids) + 1))[:length], dtype=torch.int64)


@pytest.fixture(scope="module", params=ARCHES)
def arch(request: pytest.FixtureRequest) -> str:
    """Each model family in turn."""
    return request.param
