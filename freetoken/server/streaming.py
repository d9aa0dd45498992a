"""SSE responses and client-disconnect handling shared by both APIs.

Streams use sse-starlette's ``EventSourceResponse``: it watches for ``http.disconnect`` and
cancels the event generator, whose cleanup closes the engine iterator (aborting the request).
Non-streaming requests get the same guarantee from :func:`cancel_on_disconnect`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.requests import Request

T = TypeVar("T")
_SEP = "\n"
SHUTDOWN_GRACE_S = 5.0
"""On server shutdown, how long an open stream may run on (to send its error event: the engine
ends it, see ``AsyncEngine.stop_streams``) before sse-starlette cancels it."""


def to_json(obj: Any) -> str:
    """Compact JSON text (UTF-8 kept as is)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def data_event(payload: dict | str) -> ServerSentEvent:
    """An unnamed SSE event (OpenAI style); ``payload`` is JSON-encoded unless it is a str."""
    return ServerSentEvent(data=payload if isinstance(payload, str) else to_json(payload), sep=_SEP)


def named_event(payload: dict) -> ServerSentEvent:
    """An SSE event named after ``payload["type"]`` (Anthropic style: ``event:`` + ``data:``)."""
    return ServerSentEvent(data=to_json(payload), event=payload["type"], sep=_SEP)


def anthropic_ping() -> ServerSentEvent:
    """``event: ping`` / ``data: {"type":"ping"}``."""
    return named_event({"type": "ping"})


def comment_ping() -> ServerSentEvent:
    """An SSE comment line (``: ping``), ignored by SSE parsers but resetting idle timers."""
    return ServerSentEvent(comment="ping", sep=_SEP)


def sse_response(
    events: AsyncIterator[ServerSentEvent],
    ping_interval_s: float,
    ping: Callable[[], ServerSentEvent],
) -> EventSourceResponse:
    """A ``text/event-stream`` response of ``events``, a keep-alive every ``ping_interval_s``."""
    return EventSourceResponse(
        events,
        ping=ping_interval_s,
        ping_message_factory=ping,
        sep=_SEP,
        headers={"Cache-Control": "no-cache"},
        shutdown_grace_period=SHUTDOWN_GRACE_S,
    )


class ClientDisconnected(Exception):
    """The client closed the connection before the response was ready."""


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``; if the client disconnects first, cancel it (closing the engine stream).

    The request body must already have been read.

    Raises:
        ClientDisconnected: the client went away first.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    if task.cancelled():
        raise ClientDisconnected()
    return task.result()
