"""Fixtures: a shared live server on a FakeEngine, and a factory for servers with other settings."""

from __future__ import annotations

import httpx
import pytest

from freetoken.server import ServerConfig, create_app
from tests.server.srv_fakes import ChatMLStandIn, FakeEngine, TagParserStandIn
from tests.server.srv_live import LiveServer

MODEL = "fake-model"
CAP = 64  # the shared server's max_output_tokens


class Served:
    """A running server and its doubles."""

    def __init__(
        self, config: ServerConfig, engine: FakeEngine | None = None, template=None
    ) -> None:
        self.engine = engine or FakeEngine()
        self.template = template or ChatMLStandIn()
        self.config = config
        app = create_app(
            self.engine, config, template=self.template, parser_factory=TagParserStandIn
        )
        self.live = LiveServer(app)
        self.base_url = self.live.base_url
        self.http = httpx.Client(base_url=self.base_url, timeout=10)

    def prompt_text(self) -> str:
        """The prompt text of the engine's last request."""
        return self.engine.tokenizer.decode(self.engine.last.request.prompt_ids)

    def assert_healthy(self) -> None:
        r = self.http.get("/health")
        assert (r.status_code, r.json()) == (200, {"status": "ok"})

    def close(self) -> None:
        self.http.close()
        self.live.stop()


@pytest.fixture(scope="session")
def _shared_server():
    served = Served(
        ServerConfig(served_model_name=MODEL, max_output_tokens=CAP, max_body_bytes=200_000)
    )
    yield served
    served.close()


@pytest.fixture
def srv(_shared_server):
    """The shared server, with its engine script and template log cleared."""
    _shared_server.engine.reset()
    _shared_server.template.calls.clear()
    yield _shared_server
    _shared_server.engine.reset()


@pytest.fixture
def make_server():
    """Factory for servers with their own ServerConfig / engine (stopped after the test)."""
    started: list[Served] = []

    def make(**kwargs) -> Served:
        engine = kwargs.pop("engine", None)
        config = ServerConfig(**{"served_model_name": MODEL, "max_output_tokens": CAP, **kwargs})
        served = Served(config, engine)
        started.append(served)
        return served

    yield make
    for served in started:
        served.close()
