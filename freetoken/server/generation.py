"""Drives one engine request and turns its output into parser events plus a final :class:`Finish`.

Closing any iterator returned here (client disconnect, task cancellation, ``aclose()``) closes the
engine's iterator too, which aborts the request inside the engine (EngineClient contract).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

import anyio

from freetoken.core import GenerationOutput, GenerationRequest
from freetoken.engine.client import EngineClient
from freetoken.parsers.events import ParserEvent
from freetoken.server.errors import bad_request
from freetoken.server.prompt import OutputParserLike

log = logging.getLogger("freetoken.server")
T = TypeVar("T")


class EngineFailure(Exception):
    """The engine failed or aborted a request after it was accepted (reported as a 500 or as an
    error event on an open stream)."""


class StreamStopped(EngineFailure):
    """The server ended the request from outside (it is shutting down: ``stop_streams``); an
    open stream reports it as an error and then ends as a complete stream."""


@dataclass(frozen=True)
class Finish:
    """How a generation ended.

    Attributes:
        reason: ``stop`` (EOS, stop token or stop string) or ``length`` (max_tokens reached).
        stop_reason: the matched stop string (str), stop token id (int), or None.
        prompt_tokens: prompt length in tokens.
        completion_tokens: generated tokens.
        cached_tokens: prompt tokens served from the engine's prefix cache.
    """

    reason: Literal["stop", "length"]
    stop_reason: str | int | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    @property
    def matched_stop_string(self) -> str | None:
        """The stop string that ended generation, if one did."""
        return self.stop_reason if isinstance(self.stop_reason, str) else None


@dataclass(frozen=True)
class Admitted:
    """The engine admitted the request (``GenerationRequest.report_admission``): the prompt's
    length and how much of it the prefix cache serves are known, its prefill is about to run."""

    prompt_tokens: int
    cached_tokens: int


async def close_quietly(iterator: object) -> None:
    """``await iterator.aclose()`` shielded from cancellation, logging (not raising) failures."""
    aclose = getattr(iterator, "aclose", None)
    if aclose is None:
        return
    with anyio.CancelScope(shield=True):
        try:
            await aclose()
        except Exception:  # noqa: BLE001 - cleanup must not mask the original outcome
            log.exception("closing an engine stream failed")


async def flag_slow_start(events: AsyncIterator[T], timeout_s: float) -> AsyncIterator[T | None]:
    """``events`` as they are, with one ``None`` first when the first event takes longer than
    ``timeout_s`` (a queued request: a stream can then send its opening event without it).

    Closing this iterator does not close ``events``; a first event still pending is cancelled."""

    async def first_event() -> T:
        return await anext(events)

    first = asyncio.ensure_future(first_event())
    try:
        done, _ = await asyncio.wait({first}, timeout=timeout_s)
        if not done:
            yield None
        try:
            item = await first
        except StopAsyncIteration:
            return
        yield item
        async for item in events:
            yield item
    finally:
        if not first.done():
            first.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.gather(first, return_exceptions=True)


async def engine_outputs(
    engine: EngineClient,
    request: GenerationRequest,
    on_finish: Callable[[GenerationOutput], None] | None = None,
) -> AsyncIterator[GenerationOutput]:
    """The engine's output chunks up to and including the one with a finish reason
    (``on_finish`` sees that chunk before it is yielded).

    Raises:
        APIError: 400 when the engine rejects the request (``ValueError``: empty or too long
            prompt).
        EngineFailure: the engine raised, reported ``error``/``abort``, or ended its stream
            without a finish reason.
    """
    stream = engine.generate(request)
    try:
        while True:
            try:
                out = await anext(stream)
            except StopAsyncIteration:
                raise EngineFailure("the engine ended the stream without a finish reason") from None
            except ValueError as exc:
                raise bad_request(str(exc)) from None
            except Exception as exc:
                raise EngineFailure(f"engine error: {exc}") from exc
            if out.finish_reason == "error":
                raise EngineFailure(out.error or "the engine failed while generating")
            if out.finish_reason == "abort":
                if out.error:  # ended by the server, with its reason
                    raise StreamStopped(out.error)
                raise EngineFailure("the engine aborted the request")
            if out.finish_reason is not None and on_finish is not None:
                on_finish(out)
            yield out
            if out.finish_reason is not None:
                return
    finally:
        await close_quietly(stream)


def finish_of(out: GenerationOutput) -> Finish:
    """The :class:`Finish` described by the last (finished) output chunk."""
    assert out.finish_reason in ("stop", "length"), out.finish_reason
    return Finish(
        reason=out.finish_reason,
        stop_reason=out.stop_reason,
        prompt_tokens=out.prompt_tokens,
        completion_tokens=out.completion_tokens,
        cached_tokens=out.cached_tokens,
    )


async def chat_events(
    engine: EngineClient,
    request: GenerationRequest,
    parser: OutputParserLike,
    on_finish: Callable[[GenerationOutput], None] | None = None,
) -> AsyncIterator[ParserEvent | Admitted | Finish]:
    """Parser events (text, reasoning, complete tool calls) of one request, then its Finish
    (``on_finish``: see :func:`engine_outputs`); first an :class:`Admitted` for the engine's
    admission chunk when ``request.report_admission`` asked for one.

    Raises:
        APIError, EngineFailure: as :func:`engine_outputs`.
    """
    outputs = engine_outputs(engine, request, on_finish)
    last: GenerationOutput | None = None
    try:
        async for out in outputs:
            if (request.report_admission and last is None and out.finish_reason is None
                    and not out.token_ids):
                yield Admitted(out.prompt_tokens, out.cached_tokens)
            if out.text:
                for event in parser.feed(out.text):
                    yield event
            last = out
    finally:
        await close_quietly(outputs)
    assert last is not None
    for event in parser.finish(truncated=last.finish_reason == "length"):
        yield event
    yield finish_of(last)
