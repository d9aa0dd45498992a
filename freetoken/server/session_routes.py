"""Session API: ``POST /v1/sessions``, ``GET /v1/sessions``, ``GET|DELETE /v1/sessions/{id}``.

A session fixes the harness adapter (edit boundaries → anchor policy, prompt normalisation) for
every request that carries ``X-FreeToken-Session: <id>``, and reports what those requests reused
from the prefix cache. See :mod:`freetoken.server.sessions`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from freetoken.engine.client import EngineDeadError
from freetoken.server.context import ServerContext, parse_body
from freetoken.server.sessions import Session, lookup_adapter, parse_anchors


class CreateSessionRequest(BaseModel):
    """Body of ``POST /v1/sessions``.

    Attributes:
        harness: adapter name (``claude_code``, ``opencode``, ``openclaw``, ``swe_agent``,
            ``mini_swe_agent``, ``generic``) or an alias (``claude``, ``mini-swe-agent``...).
        model: the model name the harness will request (informational).
        anchors: anchor kinds overriding the harness's policy: a comma-separated string or a
            list (``turn_start``, ``thinking_start``, ``tool_call_start``,
            ``tool_output_start``, ``generation_start``, ``generation_end``; or ``all`` /
            ``default`` / ``none``).
    """

    model_config = ConfigDict(extra="forbid")

    harness: str = Field(description="harness adapter name or alias")
    model: str | None = Field(default=None, max_length=256,
                              description="model name the harness will request")
    anchors: str | list[str] | None = Field(
        default=None, description="anchor kinds overriding the harness's checkpoint policy")


_SESSION_EXAMPLE = {
    "id": "sess_5f0c…", "object": "session", "harness": "claude_code",
    "harness_title": "Claude Code", "harness_version": None, "explicit": True,
    "model": "qwen3-next", "anchors": ["generation_end", "generation_start", "turn_start"],
    "anchors_source": "harness", "created_at": 1764500000, "last_used_at": 1764500000,
    "expires_at": 1764503600, "requests": 0, "prompt_tokens": 0, "reused_tokens": 0,
    "recomputed_tokens": 0, "generated_tokens": 0, "checkpoints_held": 0,
    "cached_prefix_tokens": 0,
}


def _json_body(model: type[BaseModel]) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": model.model_json_schema()}}}}


def _answers(example: dict) -> dict[str, Any]:
    return {200: {"content": {"application/json": {"example": example}}}}


def session_router(ctx: ServerContext) -> APIRouter:
    """The session routes bound to ``ctx`` (errors in the OpenAI shape)."""
    router = APIRouter(tags=["sessions"])
    store = ctx.sessions

    async def describe(session: Session) -> dict:
        stats = None
        if ctx.engine.is_healthy():
            try:
                stats = await ctx.engine.prefix_path_stats(session.last_prompt)
            except EngineDeadError:
                stats = None
        return session.to_json(store.idle_timeout_s, stats)

    @router.post("/v1/sessions", openapi_extra=_json_body(CreateSessionRequest),
                 responses=_answers(_SESSION_EXAMPLE))
    async def create_session(request: Request) -> Response:
        """Create a session: its requests (header ``X-FreeToken-Session: <id>``) use this
        harness's adapter and anchor policy (or ``anchors``). 400 for an unknown harness or
        anchor kind."""
        body = await parse_body(request, CreateSessionRequest)
        adapter = lookup_adapter(body.harness, "harness")
        anchors = parse_anchors(body.anchors) if body.anchors is not None else None
        session = store.create(adapter, model=body.model, anchors=anchors)
        return JSONResponse(await describe(session))

    @router.get("/v1/sessions", responses=_answers({"object": "list", "data": [_SESSION_EXAMPLE]}))
    async def list_sessions() -> Response:
        """Live sessions (explicit and detected), most recently used first."""
        data = [await describe(s) for s in store.list()]
        return JSONResponse({"object": "list", "data": data})

    @router.get("/v1/sessions/{session_id:path}", responses=_answers(_SESSION_EXAMPLE))
    async def get_session(session_id: str) -> Response:
        """One session's harness, anchors and totals: requests, prompt/reused/recomputed/
        generated tokens, checkpoints held on its latest prompt's path. 404 when unknown or
        expired."""
        return JSONResponse(await describe(store.get(session_id)))

    @router.delete("/v1/sessions/{session_id:path}",
                   responses=_answers({"id": "sess_5f0c…", "object": "session.deleted",
                                       "deleted": True}))
    async def delete_session(session_id: str) -> Response:
        """Forget a session (cached prefixes stay in the engine's cache). 404 when unknown."""
        store.delete(session_id)
        return JSONResponse({"id": session_id, "object": "session.deleted", "deleted": True})

    return router
