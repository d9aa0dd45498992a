"""OpenAI routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``."""

from __future__ import annotations

from datetime import datetime, timezone

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from freetoken.server.context import ServerContext, now, read_body
from freetoken.server.openai_chat import complete_chat, prepare_chat, stream_chat
from freetoken.server.openai_completions import (
    complete_text,
    prepare_completion,
    stream_text,
)
from freetoken.server.openai_protocol import ChatCompletionRequest, CompletionRequest
from freetoken.server.responses import json_result
from freetoken.server.sessions import request_info
from freetoken.server.streaming import comment_ping, sse_response


def openai_router(ctx: ServerContext) -> APIRouter:
    """The OpenAI-compatible routes bound to ``ctx``."""
    router = APIRouter()
    created = now()
    created_at = datetime.fromtimestamp(created, timezone.utc).isoformat().replace("+00:00", "Z")

    def model_card(name: str) -> dict:
        """A model object for ``name`` in both APIs' shapes: OpenAI ``id``/``object``/``created``/
        ``owned_by`` and Anthropic ``type``/``display_name``/``created_at`` (RFC 3339) plus
        ``max_input_tokens``/``max_tokens``, so either SDK's ``models.list()`` fills its fields."""
        return {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "freetoken",
            "type": "model",
            "display_name": name,
            "created_at": created_at,
            "max_model_len": ctx.engine.info.max_model_len,
            "max_input_tokens": ctx.engine.info.max_model_len - 1,
            "max_tokens": min(ctx.config.max_output_tokens, ctx.engine.info.max_model_len - 1),
        }

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        """Create a chat completion (``stream: true`` → SSE chunks)."""
        req, body = await read_body(request, ChatCompletionRequest)
        ctx.check_healthy()
        binding = ctx.sessions.bind(request_info(request, "openai", body))
        job = await run_in_threadpool(prepare_chat, ctx, req, binding)
        if req.stream:
            usage = bool(req.stream_options and req.stream_options.include_usage)
            return sse_response(
                stream_chat(ctx, job, usage), ctx.config.ping_interval_s, comment_ping
            )
        return await json_result(request, complete_chat(ctx, job))

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        """Create a text completion (``stream: true`` → SSE chunks)."""
        req, body = await read_body(request, CompletionRequest)
        ctx.check_healthy()
        binding = ctx.sessions.bind(request_info(request, "openai", body))
        job = await run_in_threadpool(prepare_completion, ctx, req, binding)
        if req.stream:
            usage = bool(req.stream_options and req.stream_options.include_usage)
            return sse_response(
                stream_text(ctx, job, usage), ctx.config.ping_interval_s, comment_ping
            )
        return await json_result(request, complete_text(ctx, job))

    @router.get("/v1/models")
    async def list_models() -> Response:
        """The served model (OpenAI ``object: list``; Anthropic ``has_more``/``first_id``/
        ``last_id``)."""
        name = ctx.config.served_model_name
        return JSONResponse(
            {
                "object": "list",
                "data": [model_card(name)],
                "has_more": False,
                "first_id": name,
                "last_id": name,
            }
        )

    @router.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> Response:
        """A model card echoing ``model_id``."""
        # Any name is served by the loaded model, so any name "exists".
        return JSONResponse(model_card(model_id))

    return router
