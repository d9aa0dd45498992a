"""Stopping a real `freetoken serve` process (SIGINT, as Ctrl-C, or SIGTERM) while streams are open:
every stream ends with an error in its API's format instead of being cut, and the process says
``[freetoken] stopped`` and exits 0."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest

from tests.clients.server import ServerProcess

LONG = {"max_tokens": 4000, "ignore_eos": True, "stream": True}
USER = [{"role": "user", "content": "Write a long story."}]
STREAMS = {
    "chat": ("/v1/chat/completions", {"messages": USER, **LONG}),
    "completions": ("/v1/completions", {"prompt": "Once upon a time", **LONG}),
    "messages": ("/v1/messages", {"messages": USER, **LONG}),
    "responses": ("/v1/responses", {"input": "Write a long story.", "max_output_tokens": 4000,
                                    "ignore_eos": True, "stream": True}),
}
STOPPED = "the server is shutting down"


class _Reader(threading.Thread):
    """Reads one SSE stream to its end; ``started`` is set once some data arrived."""

    def __init__(self, url: str, body: dict) -> None:
        super().__init__(daemon=True)
        self.url, self.body = url, body
        self.lines: list[str] = []
        self.started = threading.Event()

    def run(self) -> None:
        with httpx.stream("POST", self.url, json=self.body, timeout=120) as r:
            for line in r.iter_lines():
                if line:
                    self.lines.append(line)
                if len(self.lines) > 6:
                    self.started.set()
        self.started.set()

    def tail(self, n: int) -> list[str]:
        return self.lines[-n:]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_stop_signal_ends_open_streams_with_an_error(tmp_path, sig: signal.Signals) -> None:
    server = ServerProcess.start(tmp_path / "serve.log", max_output_tokens=4000)
    try:
        readers = {name: _Reader(server.base_url + path, body)
                   for name, (path, body) in STREAMS.items()}
        for reader in readers.values():
            reader.start()
        for reader in readers.values():
            assert reader.started.wait(60)
        offset = server.log_size()
        server.proc.send_signal(sig)
        assert server.proc.wait(30) == 0
        for reader in readers.values():
            reader.join(30)
            assert not reader.is_alive()
    finally:
        server.stop()
    error = {"message": STOPPED, "type": "server_error", "param": None, "code": None}
    for name in ("chat", "completions"):
        last, done = readers[name].tail(2)
        assert (json.loads(last.removeprefix("data: ")), done) == ({"error": error}, "data: [DONE]")
    name_line, data_line = readers["messages"].tail(2)
    assert name_line == "event: error"
    assert json.loads(data_line.removeprefix("data: ")) == {
        "type": "error", "error": {"type": "api_error", "message": STOPPED}}
    name_line, data_line = readers["responses"].tail(2)
    failed = json.loads(data_line.removeprefix("data: "))
    assert (name_line, failed["type"]) == ("event: response.failed", "response.failed")
    assert failed["response"]["error"] == {"code": "server_error", "message": STOPPED}
    log = server.log_since(offset)
    assert log.rstrip().endswith("[freetoken] stopped"), log[-2000:]
    assert "ASGI callable returned without completing response" not in log
