"""OpenAI Responses API routes: ``POST /v1/responses``, ``GET|DELETE /v1/responses/{id}``,
``GET /v1/responses/{id}/input_items``.

Rendering and tokenising run in a worker thread, as for chat. Unknown ids are a 404 in OpenAI's
error shape (``Response with id '…' not found.``).
"""

from __future__ import annotations

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from freetoken.server.context import ServerContext, read_body
from freetoken.server.errors import APIError
from freetoken.server.openai_responses import (
    complete_response,
    prepare_response,
    stream_response,
)
from freetoken.server.openai_responses_input_items import list_input_items
from freetoken.server.openai_responses_protocol import ResponsesRequest
from freetoken.server.openai_responses_store import ResponseStore
from freetoken.server.responses import json_result
from freetoken.server.sessions import request_info
from freetoken.server.streaming import comment_ping, sse_response


def _not_found(response_id: str) -> APIError:
    return APIError(404, f"Response with id '{response_id}' not found.")


def responses_router(ctx: ServerContext, store: ResponseStore | None = None) -> APIRouter:
    """The Responses routes bound to ``ctx``; ``store`` keeps past responses (default a new
    :class:`ResponseStore`: 256 responses, 256 MiB)."""
    router = APIRouter()
    store = store if store is not None else ResponseStore()

    @router.post("/v1/responses")
    async def create_response(request: Request) -> Response:
        """Create a model response (``stream: true`` → SSE events)."""
        req, body = await read_body(request, ResponsesRequest)
        ctx.check_healthy()
        binding = ctx.sessions.bind(request_info(request, "openai", body))
        job = await run_in_threadpool(prepare_response, ctx, req, store, binding)
        if req.stream:
            return sse_response(
                stream_response(ctx, job, store), ctx.config.ping_interval_s, comment_ping
            )
        return await json_result(request, complete_response(ctx, job, store))

    @router.get("/v1/responses/{response_id}")
    async def get_response(response_id: str) -> Response:
        """A stored response object."""
        stored = store.get(response_id)
        if stored is None:
            raise _not_found(response_id)
        return JSONResponse(stored.response)

    @router.get("/v1/responses/{response_id}/input_items")
    async def get_input_items(response_id: str, request: Request) -> Response:
        """The stored response's input items as a list object (see
        :mod:`freetoken.server.openai_responses_input_items`)."""
        stored = store.get(response_id)
        if stored is None:
            raise _not_found(response_id)
        return JSONResponse(list_input_items(response_id, stored.input_items,
                                             request.query_params))

    @router.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str) -> Response:
        """Forget a stored response: ``{"id", "object": "response", "deleted": true}``."""
        if not store.delete(response_id):
            raise _not_found(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    return router
