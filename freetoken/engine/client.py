"""The interface the HTTP layer uses to talk to an engine.

The server only ever sees an :class:`EngineClient`: the real engine (``freetoken.engine.engine``)
and test doubles implement it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, TypeVar

from freetoken.core import EngineInfo, GenerationOutput, GenerationRequest
from freetoken.engine.counters import EngineCounters
from freetoken.engine.recent import RequestTiming
from freetoken.tokenizer.tokenizer import Tokenizer

if TYPE_CHECKING:  # the offload package imports torch kernels; the protocol is only a type here
    from freetoken.offload.control import MoeRuntimeControl

T = TypeVar("T")


class EngineDeadError(RuntimeError):
    """The engine loop has died or was shut down, so it cannot run anything any more."""


class EngineClient(ABC):
    """Asynchronous front of an engine.

    Attributes:
        info: static facts about the served model (max_model_len, eos ids, ...).
        tokenizer: the served model's tokenizer.
        moe: control surface of the offloaded MoE runtime (expert cache stats and resize), or
            None when the model runs without one (``--moe-backend resident``).
        kv_page_bytes: bytes of one page of the paged KV pool (every attention layer's K and
            V), or None without a prefix cache.
    """

    info: EngineInfo
    tokenizer: Tokenizer
    moe: MoeRuntimeControl | None = None
    kv_page_bytes: int | None = None

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

    async def run_between_steps(self, fn: Callable[[], T]) -> T:
        """Run ``fn()`` on the engine thread between two steps and return its result.

        It runs at once when the engine is idle, else before the next step (after the current
        one), so it sees the model and the offload runtime in a consistent state. This default
        (for test doubles without a loop thread) calls ``fn`` directly.

        Raises:
            EngineDeadError: the engine loop is dead or shut down (``fn`` did not run).
            Exception: whatever ``fn`` raised, re-raised in the caller.
        """
        return fn()

    async def prefix_path_stats(self, token_ids: tuple[int, ...]) -> dict[str, int] | None:
        """How much of ``token_ids`` the prefix cache holds now (``cached_tokens``,
        ``checkpoints``: see ``PrefixCache.path_stats``); None without a prefix cache (this
        default).

        Raises:
            EngineDeadError: the engine loop is dead.
        """
        return None

    def counters(self) -> EngineCounters:
        """Request and token counters for ``/metrics`` (this default: all zero)."""
        return EngineCounters()

    def recent_requests(self) -> tuple[RequestTiming, ...]:
        """The last finished requests with their TTFT and decode speed, oldest first (this
        default: none)."""
        return ()

    async def prefix_checkpoint_depths(self, token_ids: tuple[int, ...]) -> tuple[int, ...] | None:
        """Depths (tokens) of the recurrent-state checkpoints held on the cached path of
        ``token_ids`` (see ``PrefixCache.checkpoint_depths``); None without a prefix cache (this
        default).

        Raises:
            EngineDeadError: the engine loop is dead.
        """
        return None
