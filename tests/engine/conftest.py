"""Shared fixtures of the engine tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from freetoken.engine.async_engine import AsyncEngine

from tests.engine.helpers import info, tokenizer


@pytest.fixture
def start_engine() -> Iterator[Callable[..., AsyncEngine]]:
    """``start_engine(model, **kw)``: an AsyncEngine over the test tokenizer (no EOS ids), shut
    down at the end of the test."""
    made: list[AsyncEngine] = []

    def start(model, **kw) -> AsyncEngine:
        engine = AsyncEngine(model, tokenizer(), info(eos=()), **kw)
        made.append(engine)
        return engine

    yield start
    for engine in made:
        engine.shutdown()
