"""OpenAI- and Anthropic-compatible HTTP server (FastAPI) in front of an :class:`EngineClient`."""

from freetoken.server.app import create_app
from freetoken.server.config import ServerConfig

__all__ = ["ServerConfig", "create_app"]
