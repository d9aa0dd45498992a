"""A real uvicorn server on a free 127.0.0.1 port, run in a background thread, plus a raw SSE
reader for checking exact event streams."""

from __future__ import annotations

import json
import socket
import threading
import time

import uvicorn
from fastapi import FastAPI


class LiveServer:
    """Serves ``app`` with uvicorn until :meth:`stop` (its own event loop, in a daemon thread)."""

    def __init__(self, app: FastAPI) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app, log_level="warning", lifespan="off", timeout_graceful_shutdown=2
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def sse_events(lines) -> list[tuple[str | None, str]]:
    """``(event name or None, data)`` of every SSE event in an iterable of text lines; comment
    lines (``: ping``) are returned as ``(":", comment)``."""
    events: list[tuple[str | None, str]] = []
    name: str | None = None
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                events.append((name, "\n".join(data)))
            name, data = None, []
        elif line.startswith(":"):
            events.append((":", line[1:].strip()))
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
    if data:
        events.append((name, "\n".join(data)))
    return events


def json_events(lines) -> list[tuple[str | None, dict | str]]:
    """Like :func:`sse_events` without comments, with JSON data decoded (``[DONE]`` kept as str)."""
    out = []
    for name, data in sse_events(lines):
        if name == ":":
            continue
        out.append((name, data if data == "[DONE]" else json.loads(data)))
    return out
