"""The operator page: ``GET /v1/freetoken/status`` (JSON) and the static ``/ui`` page that polls it.

The page's files live in ``freetoken/server/ui/`` (package data, no build step, nothing fetched
from the network at run time). ``/ui`` itself carries no data; the status route is a ``/v1/*``
route, so ``--api-key`` protects it like every other one (the page asks for the key).
"""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import RedirectResponse, Response

from freetoken.server.context import ServerContext
from freetoken.server.status import StatusBuilder
from freetoken.server.status_models import Status
from freetoken.server.ui_static import UI_DIR, mount_ui

__all__ = ["UI_DIR", "mount_ui", "status_router"]


def status_router(ctx: ServerContext) -> APIRouter:
    """``GET /v1/freetoken/status`` and the ``/ui`` redirect, bound to ``ctx``."""
    router = APIRouter()
    builder = StatusBuilder(ctx)

    @router.get("/v1/freetoken/status", response_model=Status)
    async def status() -> Status:
        """Live engine state for the ``/ui`` page: counters, the last finished requests (TTFT,
        decode tok/s), expert-cache hit rate per layer and the q split, the memory split, the
        sessions with their checkpoints and anchor kinds, and per-harness totals."""
        return await builder.build()

    @router.api_route("/ui", methods=["GET", "HEAD"], include_in_schema=False)
    async def ui_root() -> Response:
        """The page lives at ``/ui/`` (relative asset paths)."""
        return RedirectResponse("/ui/")

    return router

