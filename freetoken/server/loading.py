"""Serving while the model loads: the port answers from the first second.

``freetoken serve`` binds, starts uvicorn on :class:`LoadingApp` and loads the checkpoint in a
background thread (:func:`LoadingApp` runs the loader at ASGI start-up). Until the engine is ready,
``GET /health`` answers 503 ``{"status": "loading", "progress": {...}}``, ``GET /metrics`` the
load's gauges, ``/ui`` its static page (which shows the progress), and every other route a 503
in its API's error shape with ``Retry-After`` (Anthropic paths: 529 ``overloaded_error``, see
:func:`freetoken.server.errors.wire_status`); then the app built on the engine takes every request.
The loader thread writes :class:`LoadState`, the event loop reads it; a lock guards both.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from freetoken.models.load_progress import LoadStep
from freetoken.server.config import ServerConfig
from freetoken.server.errors import APIError, api_for_path, error_response
from freetoken.server.metrics import CONTENT_TYPE, render_loading_metrics
from freetoken.server.middleware import ErrorNetMiddleware, GuardMiddleware
from freetoken.server.ui_static import mount_ui

# Seconds a client is told to wait before retrying a request refused while the model loads.
RETRY_AFTER_S = 5


class LoadCancelled(Exception):
    """Raised into the loader (from its progress callback) once the server is stopping."""


@dataclass(frozen=True)
class LoadProgress:
    """Where the load is.

    Attributes:
        stage: ``"starting"``, ``"profile"``, ``"tokenizer"``, ``"weights"``, ``"experts"`` or
            ``"engine"`` (see ``AsyncEngine.from_pretrained``).
        elapsed_s: seconds since the load started.
        done_bytes, total_bytes: checkpoint bytes read so far / to read, None until the first
            tensor is read.
    """

    stage: str
    elapsed_s: float
    done_bytes: int | None = None
    total_bytes: int | None = None

    @property
    def fraction(self) -> float | None:
        """``done_bytes / total_bytes`` (None while unknown)."""
        if self.done_bytes is None or not self.total_bytes:
            return None
        return self.done_bytes / self.total_bytes

    def to_json(self) -> dict:
        """``{"stage", "elapsed_s", "done_bytes", "total_bytes", "fraction"}`` (nulls when
        unknown; seconds to 0.1, the fraction to 4 places)."""
        fraction = self.fraction
        return {"stage": self.stage, "elapsed_s": round(self.elapsed_s, 1),
                "done_bytes": self.done_bytes, "total_bytes": self.total_bytes,
                "fraction": None if fraction is None else round(fraction, 4)}

    def describe(self) -> str:
        """``weights 42%`` / ``engine``: the stage, with the share read when known."""
        fraction = self.fraction
        return self.stage if fraction is None else f"{self.stage} {fraction:.0%}"


class LoadState:
    """The load's stage, byte counts, outcome (the ready app or the error) and stop flag."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._started = clock()
        self._stage = "starting"
        self._done: int | None = None
        self._total: int | None = None
        self._app: ASGIApp | None = None
        self._error: str | None = None
        self._closed = False

    def set_stage(self, stage: str) -> None:
        """The load moved on to ``stage``.

        Raises:
            LoadCancelled: the server is stopping (:meth:`close`).
        """
        with self._lock:
            self._check_open()
            self._stage = stage

    def step(self, step: LoadStep) -> None:
        """A tensor was read (``loader.load_weights``' callback): record the bytes so far.

        Raises:
            LoadCancelled: the server is stopping (:meth:`close`).
        """
        with self._lock:
            self._check_open()
            self._done, self._total = step.done_bytes, step.total_bytes

    def progress(self) -> LoadProgress:
        """A snapshot of the progress."""
        with self._lock:
            return LoadProgress(self._stage, self._clock() - self._started, self._done,
                                self._total)

    def finish(self, app: ASGIApp) -> bool:
        """The load succeeded: ``app`` serves every request from now on. False (nothing
        changed) when the server is already stopping."""
        with self._lock:
            if self._closed:
                return False
            self._app = app
            return True

    def fail(self, message: str) -> None:
        """The load failed with ``message`` (``/health`` reports it until the process exits)."""
        with self._lock:
            self._error = message

    def close(self) -> None:
        """The server is stopping: a load still running is cancelled at its next step."""
        with self._lock:
            self._closed = True

    @property
    def app(self) -> ASGIApp | None:
        """The app built on the loaded engine, None until then."""
        return self._app

    @property
    def error(self) -> str | None:
        """Why the load failed, None while it has not."""
        return self._error

    def _check_open(self) -> None:
        if self._closed:
            raise LoadCancelled("the server is stopping")


def _loading_error(progress: LoadProgress) -> APIError:
    return APIError(503, f"the model is loading ({progress.describe()}, "
                         f"{progress.elapsed_s:.0f} s so far); retry in {RETRY_AFTER_S} s",
                    code="model_loading")


async def _while_loading(state: LoadState, scope: Scope, receive: Receive, send: Send) -> None:
    """The answer to a request that arrives before the engine is ready."""
    headers = {"Retry-After": str(RETRY_AFTER_S)}
    if state.error is not None:
        body = {"status": "failed", "error": state.error}
        err = APIError(503, f"the model failed to load: {state.error}", code="model_load_failed")
    else:
        progress = state.progress()
        body = {"status": "loading", "progress": progress.to_json()}
        err = _loading_error(progress)
    path = scope["path"]
    if path == "/metrics" and state.error is None and scope.get("method") in ("GET", "HEAD"):
        progress = state.progress()
        response = Response(render_loading_metrics(progress.stage, progress.fraction,
                                                   progress.elapsed_s), media_type=CONTENT_TYPE)
    elif path == "/health":
        response = JSONResponse(body, status_code=503, headers=headers)
    else:
        response = error_response(err, api_for_path(scope["path"]))
        response.headers.update(headers)
    await response(scope, receive, send)


class LoadingApp:
    """The ASGI app uvicorn serves: 503s while loading (behind the same API-key and body-size
    guard as the real app), then ``state.app``.

    Args:
        state: the load's state, written by the loader.
        config: the server settings (API key, body limit).
        start: called once at ASGI start-up (``lifespan.startup``): starts the loader thread.

    ASGI lifespan events stop here: the loaded app gets none (``create_app`` registers no
    start-up or shutdown handler).
    """

    def __init__(self, state: LoadState, config: ServerConfig,
                 start: Callable[[], None] | None = None) -> None:
        self.state = state
        self._start = start

        # the operator page is static: it loads and shows the progress while the model loads
        ui = Starlette(routes=[Route("/ui", lambda _request: RedirectResponse("/ui/"))])
        mount_ui(ui)

        async def loading(scope: Scope, receive: Receive, send: Send) -> None:
            path = scope.get("path", "")
            if scope["type"] == "http" and (path == "/ui" or path.startswith("/ui/")):
                await ui(scope, receive, send)
                return
            await _while_loading(state, scope, receive, send)

        self._loading = ErrorNetMiddleware(GuardMiddleware(loading, config=config))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        app = self.state.app
        await (app if app is not None else self._loading)(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                if self._start is not None:
                    self._start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.state.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


class QuietLoadingPolls(logging.Filter):
    """Drops uvicorn's access-log line of each ``GET /health`` answered 503 (loading): a client
    waiting for the model (``freetoken launch`` polls every second) would otherwise fill the
    server log with one line per poll. Every other line passes (record args as uvicorn's
    ``AccessFormatter`` takes them: client, method, path, HTTP version, status)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not isinstance(args, tuple) or len(args) != 5:
            return True
        _client, method, path, _version, status = args
        return not (method == "GET" and path == "/health" and status == 503)
