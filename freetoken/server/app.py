"""The FastAPI application: wires the engine, settings, template and parser to the routes."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from freetoken import __version__
from freetoken.engine.client import EngineClient
from freetoken.server.admin_routes import admin_router
from freetoken.server.anthropic_routes import anthropic_router
from freetoken.server.config import ServerConfig
from freetoken.server.context import ServerContext
from freetoken.server.errors import APIError, api_for_path, error_response
from freetoken.server.middleware import ErrorNetMiddleware, GuardMiddleware
from freetoken.server.openai_responses_routes import responses_router
from freetoken.server.openai_routes import openai_router
from freetoken.server.prompt import ParserFactory, PromptTemplate
from freetoken.server.session_routes import session_router
from freetoken.server.sessions import SessionStore
from freetoken.server.ui_routes import mount_ui, status_router

API_DESCRIPTION = (
    "OpenAI- and Anthropic-compatible serving of Mixture-of-Experts checkpoints for coding agents. "
    "Every chat request is served by a harness adapter (Claude Code, OpenCode, OpenClaw, "
    "SWE-agent, mini-swe-agent, or generic), chosen by the `X-FreeToken-Session` header (a "
    "session made with `POST /v1/sessions`), the `X-FreeToken-Harness` header, or detection "
    "from the request; the adapter sets where recurrent-state checkpoints go and normalises "
    "known prefix busters. `GET /v1/sessions` reports what each session reused."
)


def default_template(engine: EngineClient) -> PromptTemplate:
    """The checkpoint's chat template, or the bundled one for its model type."""
    from freetoken.chat.template import ChatTemplate

    return ChatTemplate.for_model(engine.tokenizer.chat_template, engine.info.model_type)


def default_parser_factory(model_type: str, template: PromptTemplate) -> ParserFactory:
    """The output parser of the model's chat format, called as ``Parser(tools, in_reasoning=...,
    parse_tools=...)`` once per request: ``freetoken.parsers.HarmonyParser`` for gpt-oss
    (``model_type`` ``gpt_oss``, or a template written in harmony, see ``call_form``), else
    ``freetoken.parsers.OutputParser`` (think tags and the tool-call tag forms)."""
    from freetoken.parsers import HarmonyParser, OutputParser
    from freetoken.server.tools import call_form

    if model_type == "gpt_oss" or call_form(template) == "harmony":
        return HarmonyParser
    return OutputParser


def create_app(
    engine: EngineClient,
    config: ServerConfig,
    *,
    template: PromptTemplate | None = None,
    parser_factory: ParserFactory | None = None,
) -> FastAPI:
    """Build the HTTP app serving ``engine`` through the OpenAI and Anthropic APIs.

    Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``,
    ``POST /v1/responses``, ``GET|DELETE /v1/responses/{id}``,
    ``POST /v1/messages``, ``POST /v1/messages/count_tokens``, ``GET /health``, ``GET|HEAD /``,
    the operator routes ``GET /metrics``, ``GET|POST /v1/freetoken/memory`` and
    ``GET /v1/freetoken/status``, and the operator page ``/ui/`` (static files).
    Every error (including unknown routes and bugs, see ``ErrorNetMiddleware``) is answered in
    the shape of the API its path belongs to (``/v1/messages*`` Anthropic, everything else
    OpenAI).

    Args:
        engine: the engine (its ``tokenizer``, ``info.max_model_len`` and ``generate`` are used).
        config: server settings.
        template: chat template override; default ``ChatTemplate.for_model(tokenizer's
            template, info.model_type)``.
        parser_factory: output-parser constructor override; default
            :func:`default_parser_factory` (``HarmonyParser`` for gpt-oss, else
            ``OutputParser``).

    Raises:
        Whatever the default template / parser lookup raises (no template for the model type).
    """
    template = template if template is not None else default_template(engine)
    if parser_factory is None:
        parser_factory = default_parser_factory(engine.info.model_type, template)
    ctx = ServerContext(
        engine=engine,
        config=config,
        template=template,
        parser_factory=parser_factory,
        sessions=SessionStore(config.session_idle_timeout_s, config.max_sessions),
    )
    app = FastAPI(
        title="FreeToken",
        description=API_DESCRIPTION,
        version=__version__,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    app.state.freetoken = ctx
    app.add_middleware(GuardMiddleware, config=config)
    app.add_middleware(ErrorNetMiddleware)  # added last = outermost: also covers the guard

    @app.exception_handler(APIError)
    async def on_api_error(request: Request, exc: APIError) -> Response:
        """An APIError in the shape of the path's API."""
        return error_response(exc, api_for_path(request.url.path))

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> Response:
        """Unknown route (404) or method (405) in the shape of the path's API."""
        where = f"{request.method} {request.url.path}"
        message = f"Invalid URL ({where})" if exc.status_code == 404 else f"{exc.detail} ({where})"
        return error_response(APIError(exc.status_code, message), api_for_path(request.url.path))

    @app.get("/health")
    async def health() -> Response:
        """200 ``{"status": "ok"}`` while the engine is healthy, else 503."""
        if engine.is_healthy():
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "unhealthy"}, status_code=503)

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def root() -> Response:
        """Connectivity check (Claude Code sends ``HEAD /``)."""
        return JSONResponse({"status": "ok", "name": "freetoken"})

    app.include_router(openai_router(ctx))
    app.include_router(responses_router(ctx))
    app.include_router(anthropic_router(ctx))
    app.include_router(admin_router(ctx))
    app.include_router(session_router(ctx))
    app.include_router(status_router(ctx))
    mount_ui(app)
    return app
