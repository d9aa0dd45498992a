"""ASGI layers in front of every route: a last-resort error net, the API-key check and the
request-body size limit.

Written as plain ASGI (not ``BaseHTTPMiddleware``) so ``receive`` keeps delivering
``http.disconnect`` to the routes after the body has been read; the body is buffered once and
replayed to the app.
"""

from __future__ import annotations

import hmac
import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from freetoken.server.config import ServerConfig
from freetoken.server.errors import APIError, api_for_path, error_response

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
log = logging.getLogger("freetoken.server")


def presented_key(headers: dict[bytes, bytes]) -> str | None:
    """The API key a request carries: ``Authorization: Bearer <key>`` or ``x-api-key: <key>``."""
    auth = headers.get(b"authorization", b"").decode("latin-1").strip()
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    key = headers.get(b"x-api-key")
    return key.decode("latin-1").strip() if key is not None else None


class GuardMiddleware:
    """Rejects unauthenticated ``/v1/*`` and ``/metrics`` requests (401) and bodies over the
    limit (413).

    Both errors use the shape of the API the path belongs to. ``/``, ``/health`` need no key.
    """

    def __init__(self, app: ASGIApp, config: ServerConfig) -> None:
        self.app = app
        self.config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        api = api_for_path(path)
        if self.config.api_key is not None and (path.startswith("/v1/") or path == "/metrics"):
            err = self._auth_error(dict(scope["headers"]))
            if err is not None:
                await error_response(err, api)(scope, receive, send)
                return
        if scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        body, too_large, disconnected = await self._read_body(receive)
        if disconnected:
            return
        if too_large:
            err = APIError(
                413,
                "request body is larger than the server limit of "
                f"{self.config.max_body_bytes} bytes",
            )
            await error_response(err, api)(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)

    def _auth_error(self, headers: dict[bytes, bytes]) -> APIError | None:
        key = presented_key(headers)
        if key is None:
            return APIError(
                401,
                "missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                code="invalid_api_key",
            )
        assert self.config.api_key is not None
        if not hmac.compare_digest(key.encode(), self.config.api_key.encode()):
            return APIError(401, "invalid API key", code="invalid_api_key")
        return None

    async def _read_body(self, receive: Receive) -> tuple[bytes, bool, bool]:
        """(body, too_large, disconnected). An oversized body is drained but not kept."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return b"", False, True
            chunk = message.get("body", b"")
            size += len(chunk)
            if size <= self.config.max_body_bytes:
                chunks.append(chunk)
            if not message.get("more_body", False):
                break
        too_large = size > self.config.max_body_bytes
        return (b"" if too_large else b"".join(chunks)), too_large, False


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        """The buffered body first, then the real ``receive``."""
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class ErrorNetMiddleware:
    """Answers an exception that escaped the routes (a bug) with a 500 in the path's API shape.

    Starlette's own ``ServerErrorMiddleware`` sends its 500 and then re-raises, so uvicorn logs
    the error a second time and closes the keep-alive connection; a client that pipelines its
    next request on that connection then fails with a reset. Here the exception is logged once
    and the connection stays usable. If the response had already started (a stream), nothing
    well-formed can follow: the exception is logged and the response ends.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            """Forward ``message``, noting when the response head went out."""
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:  # noqa: BLE001 - last resort: answer instead of dropping
            log.exception("unhandled error on %s %s", scope.get("method"), scope["path"])
            if started:
                return
            err = APIError(500, f"internal server error: {type(exc).__name__}: {exc}")
            await error_response(err, api_for_path(scope["path"]))(scope, receive, send)
