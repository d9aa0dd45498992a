"""OpenAI- and Anthropic-compatible HTTP server (FastAPI) in front of an :class:`EngineClient`.

Request path: ``middleware`` (API key, body limit) → ``*_routes`` → ``context.parse_body``
(pydantic models in ``*_protocol``) → ``openai_chat`` / ``anthropic_chat`` / ``openai_completions``
build a job: ``messages`` + ``tools`` normalise the conversation, ``prompt`` renders and tokenizes
it and checks the context, ``sampling`` clamps the output limit → ``generation`` drives the engine
and the output parser → ``anthropic_blocks`` / the OpenAI builders shape the events; ``streaming``
sends SSE (keep-alive pings, disconnect → abort) and ``responses`` the JSON answers; ``errors``
renders every failure in the API's own shape.

Wiring (CLI): ``create_app(engine, ServerConfig(...))`` then ``uvicorn.run(app, ...)``.
"""

from freetoken.server.app import create_app
from freetoken.server.config import ServerConfig

__all__ = ["ServerConfig", "create_app"]
