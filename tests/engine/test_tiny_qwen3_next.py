"""The engine over the real tiny qwen3_next checkpoint (Gated DeltaNet + attention + MoE)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from freetoken.engine.async_engine import AsyncEngine
from freetoken.engine.engine import Engine
from freetoken.models.config import ModelConfig
from freetoken.models.registry import load_model
from freetoken.models.tiny import default_model_path

from freetoken.tokenizer.tokenizer import Tokenizer

from tests.engine.helpers import ids_of, request, run_alone, text_of, tokenizer

PROMPT = tokenizer().encode("<|im_start|>user\nWrite a haiku about tests.<|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def checkpoint() -> Path:
    return default_model_path()


LOAD_MESSAGES: list[str] = []


@pytest.fixture(scope="module")
def engine(checkpoint: Path) -> Iterator[AsyncEngine]:
    e = AsyncEngine.from_pretrained(checkpoint, dtype=torch.float32, device="cpu",
                                    max_model_len=64, progress=LOAD_MESSAGES.append)
    yield e
    e.shutdown()


def _greedy_reference(checkpoint: Path, prompt: list[int], n: int) -> list[int]:
    model = load_model(checkpoint)
    state = model.new_state()
    out: list[int] = []
    with torch.inference_mode():
        logits = model(torch.tensor(prompt), state)
        for _ in range(n):
            out.append(int(logits[-1].argmax()))
            logits = model(torch.tensor(out[-1:]), state)
    return out


def test_from_pretrained_reports_progress_and_info(engine: AsyncEngine, checkpoint: Path) -> None:
    cfg = ModelConfig.from_file(checkpoint)
    assert LOAD_MESSAGES[:2] == [
        f"reading tokenizer from {checkpoint}",
        f"loading qwen3_next weights ({cfg.num_hidden_layers} layers, "
        f"{cfg.num_experts} experts per MoE layer)",
    ]
    assert LOAD_MESSAGES[2].startswith("weights loaded in ") and len(LOAD_MESSAGES) == 4
    # 8 running requests x 64 tokens = 32 pages of 16
    assert LOAD_MESSAGES[3].startswith("KV cache: 32 pages x 16 tokens = 512 tokens (")
    assert ("up to 8 running requests, prefix reuse on; recurrent-state checkpoints ("
            in LOAD_MESSAGES[3])
    assert LOAD_MESSAGES[3].endswith(
        "8 device slots + 16384 MiB host tier, anchors turn_start,generation_start,generation_end")
    info = engine.info
    assert (info.model_type, info.vocab_size, info.max_model_len) == ("qwen3_next", 8256, 64)
    assert info.eos_token_ids == (8194, 8192)
    assert info.model_path == str(checkpoint)


def test_greedy_stream_matches_direct_model_calls(engine: AsyncEngine, checkpoint: Path) -> None:
    async def main():
        return [c async for c in engine.generate(request(PROMPT, max_tokens=6, ignore_eos=True))]

    chunks = asyncio.run(main())
    assert ids_of(chunks) == _greedy_reference(checkpoint, PROMPT, 6)
    assert text_of(chunks) == engine.tokenizer.decode(ids_of(chunks), skip_special_tokens=True)
    assert chunks[-1].finish_reason == "length"


def test_max_model_len_caps_and_long_prompt_is_rejected(engine: AsyncEngine) -> None:
    with pytest.raises(ValueError, match="maximum context length is 64 tokens, but the prompt has 64"):
        engine.generate(request([1] * 64))

    async def main():
        return [c async for c in engine.generate(request([1] * 60, max_tokens=50, ignore_eos=True))]

    chunks = asyncio.run(main())
    assert len(ids_of(chunks)) == 4 and chunks[-1].finish_reason == "length"


def test_chunked_prefill_matches_one_shot_and_seed_reproduces(
    engine: AsyncEngine, checkpoint: Path
) -> None:
    model = load_model(checkpoint)
    tok = Tokenizer.from_pretrained(checkpoint)
    outs = []
    for budget, seed in ((3, 9), (2048, 9), (2048, 10)):
        eng = Engine(model, tok, engine.info, max_num_batched_tokens=budget)
        req = request(PROMPT, temperature=1.0, seed=seed, max_tokens=8, ignore_eos=True)
        outs.append(ids_of(run_alone(eng, req)))
    assert outs[0] == outs[1] != outs[2]


def test_bad_max_model_len_is_rejected(checkpoint: Path) -> None:
    with pytest.raises(ValueError, match=r"max_model_len must be in \[2, 262144\]"):
        AsyncEngine.from_pretrained(checkpoint, max_model_len=10**7)
