"""OpenAI- and Anthropic-compatible HTTP server (FastAPI) in front of an :class:`EngineClient`.

Request path: ``middleware`` (error net, API key, body limit) → ``*_routes`` →
``context.parse_body`` (strict JSON; pydantic models in ``*_protocol``) → ``openai_chat`` /
``anthropic_chat`` / ``openai_completions`` / ``openai_responses`` (its input items folded into
chat messages by ``openai_responses_input``) build a job in a worker thread: ``messages`` +
``tools`` normalise the conversation, ``prompt`` renders and tokenizes it and checks the context,
``sampling`` clamps the output limit → ``generation`` drives the engine and the output parser →
``anthropic_blocks`` / ``openai_responses_items`` / the OpenAI builders shape the events;
``streaming`` sends SSE (keep-alive pings, disconnect → abort) and ``responses`` the JSON answers
(past Responses API responses live in ``openai_responses_store``); ``errors`` renders every
failure in the API's own shape.

Wiring (CLI, ``freetoken.launch``): uvicorn serves ``loading.LoadingApp`` on a socket bound before
the model loads (``/health`` 503 with the progress, every route 503 in its API's shape); the
loader thread then hands every request to ``create_app(engine, ServerConfig(...))``.
"""

from __future__ import annotations

from freetoken.server.config import ServerConfig

__all__ = ["ServerConfig", "create_app"]


def __getattr__(name: str):
    # the app (and torch with it) is imported on first use: the loading server runs without it
    if name == "create_app":
        from freetoken.server.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
