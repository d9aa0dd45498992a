"""OpenAI routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from freetoken.server.context import ServerContext, now, parse_body
from freetoken.server.openai_chat import complete_chat, prepare_chat, stream_chat
from freetoken.server.openai_completions import (
    complete_text,
    prepare_completion,
    stream_text,
)
from freetoken.server.openai_protocol import ChatCompletionRequest, CompletionRequest
from freetoken.server.responses import json_result
from freetoken.server.streaming import comment_ping, sse_response


def openai_router(ctx: ServerContext) -> APIRouter:
    """The OpenAI-compatible routes bound to ``ctx``."""
    router = APIRouter()
    created = now()

    def model_card(name: str) -> dict:
        """A ``model`` object for ``name``."""
        return {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "freetoken",
            "max_model_len": ctx.engine.info.max_model_len,
        }

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        """Create a chat completion (``stream: true`` → SSE chunks)."""
        req = await parse_body(request, ChatCompletionRequest)
        ctx.check_healthy()
        job = await run_in_threadpool(prepare_chat, ctx, req)
        if req.stream:
            usage = bool(req.stream_options and req.stream_options.include_usage)
            return sse_response(
                stream_chat(ctx, job, usage), ctx.config.ping_interval_s, comment_ping
            )
        return await json_result(request, complete_chat(ctx, job))

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        """Create a text completion (``stream: true`` → SSE chunks)."""
        req = await parse_body(request, CompletionRequest)
        ctx.check_healthy()
        job = await run_in_threadpool(prepare_completion, ctx, req)
        if req.stream:
            usage = bool(req.stream_options and req.stream_options.include_usage)
            return sse_response(
                stream_text(ctx, job, usage), ctx.config.ping_interval_s, comment_ping
            )
        return await json_result(request, complete_text(ctx, job))

    @router.get("/v1/models")
    async def list_models() -> Response:
        """The served model name (``object: list``)."""
        return JSONResponse({"object": "list", "data": [model_card(ctx.config.served_model_name)]})

    @router.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> Response:
        """A model card echoing ``model_id``."""
        # Any name is served by the loaded model, so any name "exists".
        return JSONResponse(model_card(model_id))

    return router
