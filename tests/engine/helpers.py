"""Shared helpers for the engine tests: the committed tokenizer, requests and a sync runner."""

from __future__ import annotations

from functools import lru_cache

from freetoken.core import EngineInfo, GenerationOutput, GenerationRequest, SamplingParams
from freetoken.engine.engine import Engine
from freetoken.paths import ASSETS_DIR
from freetoken.tokenizer.tokenizer import Tokenizer

IM_END = 8194  # <|im_end|> in the committed tokenizer
ENDOFTEXT = 8192  # <|endoftext|>


@lru_cache(maxsize=1)
def tokenizer() -> Tokenizer:
    """The project's committed byte-level BPE tokenizer (vocab 8218)."""
    return Tokenizer.from_pretrained(ASSETS_DIR / "tokenizer")


def info(max_model_len: int = 4096, eos: tuple[int, ...] = (IM_END,)) -> EngineInfo:
    """EngineInfo for a fake model over the committed tokenizer's vocabulary."""
    return EngineInfo(model_path="fake", model_type="fake", max_model_len=max_model_len,
                      vocab_size=tokenizer().vocab_size, eos_token_ids=eos)


def request(prompt: list[int] | tuple[int, ...], rid: str = "r", **sampling) -> GenerationRequest:
    """A request with greedy sampling unless ``sampling`` says otherwise."""
    sampling.setdefault("temperature", 0.0)
    return GenerationRequest(rid, tuple(prompt), SamplingParams(**sampling))


def run_alone(engine: Engine, req: GenerationRequest, key: int = 0) -> list[GenerationOutput]:
    """Queue ``req`` on a synchronous engine and step until it finishes; returns its chunks."""
    chunks: list[GenerationOutput] = []
    engine.add_request(key, req, chunks.append)
    while engine.step():
        pass
    assert chunks and chunks[-1].finish_reason is not None
    return chunks


def text_of(chunks: list[GenerationOutput]) -> str:
    """Concatenated text of a chunk stream."""
    return "".join(c.text for c in chunks)


def ids_of(chunks: list[GenerationOutput]) -> list[int]:
    """Concatenated token ids of a chunk stream."""
    return [t for c in chunks for t in c.token_ids]
