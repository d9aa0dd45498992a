"""Shared helpers for the output-parser tests: feeding text in different chunkings."""

from __future__ import annotations

import random

import pytest

from freetoken.parsers import OutputParser, coalesce

WRITE_TOOL = {
    "type": "function",
    "function": {
        "name": "write",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "content": {"type": "string"},
                "zip": {"type": "string"},
                "count": {"type": "integer"},
                "ratio": {"type": "number"},
                "force": {"type": "boolean"},
                "meta": {"type": "object"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "mode": {"type": ["integer", "null"]},
                "anything": {},
            },
        },
    },
}


def run_chunks(text: str, chunks: list[str] | None = None, **parser_kwargs) -> list:
    """Raw (uncoalesced) events of feeding ``chunks`` (default: one piece) then finish()."""
    parser_kwargs.setdefault("in_reasoning", False)
    tools = parser_kwargs.pop("tools", [WRITE_TOOL])
    parser = OutputParser(tools, **parser_kwargs)
    events = []
    for chunk in chunks if chunks is not None else [text]:
        events += parser.feed(chunk)
    return events + parser.finish()


def chunkings(text: str, seeds: int = 20) -> list[list[str]]:
    """One piece, one character at a time, and ``seeds`` random splits (pieces of 1-9 chars)."""
    out = [[text], list(text)]
    for seed in range(seeds):
        rng = random.Random(seed)
        pieces, i = [], 0
        while i < len(text):
            step = rng.randint(1, 9)
            pieces.append(text[i : i + step])
            i += step
        out.append(pieces)
    return out


def parse_all_ways(text: str, **parser_kwargs) -> list:
    """Coalesced events; asserts every chunking of ``text`` gives the same ones."""
    results = [coalesce(run_chunks(text, pieces, **dict(parser_kwargs))) for pieces in chunkings(text)]
    for other in results[1:]:
        assert other == results[0]
    return results[0]


@pytest.fixture
def write_tool() -> dict:
    return WRITE_TOOL


@pytest.fixture
def parse():
    """``parse(text, **OutputParser kwargs)`` → coalesced events, checked across chunkings."""
    return parse_all_ways


@pytest.fixture
def run():
    """``run(text, chunks=None, **OutputParser kwargs)`` → raw events of one chunking."""
    return run_chunks


@pytest.fixture(scope="session")
def tiny_tokenizer_pieces():
    """``pieces(text)`` → the text split the way the engine streams it: one decoded token each."""
    from freetoken.paths import ASSETS_DIR
    from freetoken.tokenizer.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_pretrained(ASSETS_DIR / "tokenizer")
    return lambda text: [tokenizer.decode([i]) for i in tokenizer.encode(text)]
