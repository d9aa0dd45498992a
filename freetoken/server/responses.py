"""Turning a non-streaming job into an HTTP response (with disconnect → abort)."""

from __future__ import annotations

from collections.abc import Awaitable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from freetoken.server.errors import APIError
from freetoken.server.generation import EngineFailure, StreamStopped
from freetoken.server.streaming import ClientDisconnected, cancel_on_disconnect

# nginx's "client closed request"; nobody receives it, it only shows in access logs.
CLIENT_CLOSED_STATUS = 499


async def json_result(request: Request, work: Awaitable[dict]) -> Response:
    """Await ``work`` (aborting it if the client disconnects) and answer its dict as JSON.

    Raises:
        APIError: 503 when the server is shutting down (retry elsewhere or later), 500 when the
            engine failed; APIErrors from ``work`` pass through.
    """
    try:
        body = await cancel_on_disconnect(request, work)
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED_STATUS)
    except StreamStopped as exc:
        raise APIError(503, str(exc)) from None
    except EngineFailure as exc:
        raise APIError(500, str(exc)) from None
    return JSONResponse(body)
