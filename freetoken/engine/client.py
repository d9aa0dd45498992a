"""The interface the HTTP layer uses to talk to an engine.

The server only ever sees an :class:`EngineClient`: the real engine (``freetoken.engine.engine``)
and test doubles implement it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator

from freetoken.core import EngineInfo, GenerationOutput, GenerationRequest
from freetoken.tokenizer.tokenizer import Tokenizer


class EngineClient(ABC):
    """Asynchronous front of an engine.

    Attributes:
        info: static facts about the served model (max_model_len, eos ids, ...).
        tokenizer: the served model's tokenizer.
    """

    info: EngineInfo
    tokenizer: Tokenizer

    @abstractmethod
    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        """Queue ``request`` and stream its output chunks.

        Requests run one after another (they queue; their states never interleave). The last
        chunk has ``finish_reason`` set. Closing the iterator early (client disconnect,
        ``aclose()`` or task cancellation) aborts the request within one decode step.

        Raises:
            ValueError: the prompt is empty or longer than ``info.max_model_len``.
        """

    def is_healthy(self) -> bool:
        """True while the engine loop is alive."""
        return True
