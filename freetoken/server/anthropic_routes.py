"""Anthropic routes: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

Query strings such as ``?beta=true`` (sent by the Anthropic SDKs and Claude Code) are ignored, as
are ``anthropic-version`` and the ``anthropic-beta`` flags except interleaved thinking (a
thinking budget may then exceed ``max_tokens``). Rendering and tokenising run in a worker
thread so a huge prompt never stalls the event loop.
"""

from __future__ import annotations

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from freetoken.server.anthropic_chat import (
    check_thinking_budget,
    complete_message,
    prepare_messages,
    render_request,
    stream_message,
)
from freetoken.server.anthropic_protocol import CountTokensRequest, MessagesRequest
from freetoken.server.context import ServerContext, read_body
from freetoken.server.responses import json_result
from freetoken.server.sessions import request_info
from freetoken.server.streaming import anthropic_ping, sse_response


def anthropic_router(ctx: ServerContext) -> APIRouter:
    """The Anthropic-compatible routes bound to ``ctx``."""
    router = APIRouter()

    @router.post("/v1/messages")
    async def messages(request: Request) -> Response:
        """Create a message (``stream: true`` → SSE events)."""
        req, body = await read_body(request, MessagesRequest)
        check_thinking_budget(req, request.headers.get("anthropic-beta"))
        ctx.check_healthy()
        binding = ctx.sessions.bind(request_info(request, "anthropic", body))
        job = await run_in_threadpool(prepare_messages, ctx, req, binding)
        if req.stream:
            return sse_response(
                stream_message(ctx, job), ctx.config.ping_interval_s, anthropic_ping
            )
        return await json_result(request, complete_message(ctx, job))

    @router.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Response:
        """``{"input_tokens": N}``: tokens of the rendered prompt (nothing is generated)."""
        req, body = await read_body(request, CountTokensRequest)
        adapter = ctx.sessions.adapter_for(request_info(request, "anthropic", body))
        prompt, _ = await run_in_threadpool(render_request, ctx, req, adapter)
        return JSONResponse({"input_tokens": len(prompt.token_ids)})

    return router
