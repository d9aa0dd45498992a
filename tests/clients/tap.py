"""A recording TCP relay between an agent client and ``freetoken serve``.

The relay forwards bytes unchanged in both directions (HTTP/1.1, keep-alive, chunked SSE) and parses
a copy of each direction, so the tests see exactly what a client sent and what the server answered,
whatever the server logs. A parse failure is recorded in ``Tap.errors`` and never alters the bytes
forwarded. Follows RFC 9112 (HTTP/1.1 message framing: Content-Length, chunked transfer coding,
read-until-close) for the parsing.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .framing import HttpFramer

MAX_BODY = 8 << 20  # bytes kept per message; the rest is counted, not stored


@dataclass
class Exchange:
    """One HTTP request and its response, as seen on the wire.

    ``request_size`` and ``response_size`` count body bytes after de-chunking (before any
    Content-Encoding is undone); ``status`` is None until the response head arrived and ``complete``
    turns True once the whole response body did; ``abandoned`` is set when the client closed the
    connection while the response was still incomplete. Times are ``time.monotonic()`` seconds.
    """

    conn: int
    method: str
    target: str
    request_headers: dict[str, str]
    request_body: bytes
    request_size: int
    started: float
    status: int | None = None
    response_headers: dict[str, str] = field(default_factory=dict)
    response_body: bytes = b""
    response_size: int = 0
    complete: bool = False
    finished: float | None = None
    abandoned: float | None = None  # when the client closed its connection before the response ended

    @property
    def path(self) -> str:
        """The target without its query string."""
        return self.target.split("?", 1)[0]

    @property
    def query(self) -> str:
        """The query string ('' when none)."""
        return self.target.split("?", 1)[1] if "?" in self.target else ""

    def request_json(self) -> Any:
        """The request body parsed as JSON, or None when it is empty or not JSON."""
        try:
            return json.loads(self.request_body) if self.request_body else None
        except ValueError:
            return None

    @property
    def model(self) -> str | None:
        """The ``model`` field of a JSON request body."""
        body = self.request_json()
        return body.get("model") if isinstance(body, dict) else None

    @property
    def stream(self) -> bool | None:
        """The ``stream`` field of a JSON request body (None when absent)."""
        body = self.request_json()
        return body.get("stream") if isinstance(body, dict) else None

    def response_text(self) -> str:
        """The response body with any gzip/deflate Content-Encoding undone, as UTF-8 text.

        Raises:
            ValueError: another Content-Encoding (br, zstd) that the standard library cannot undo.
        """
        body = self.response_body
        encoding = self.response_headers.get("content-encoding", "").lower()
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        elif encoding not in ("", "identity"):
            raise ValueError(f"cannot undo Content-Encoding {encoding!r}")
        return body.decode("utf-8", "replace")

    @property
    def seconds(self) -> float | None:
        """Wall time from the request head to the end of the response."""
        return None if self.finished is None else self.finished - self.started


class Tap:
    """Relay ``127.0.0.1:<port>`` to ``upstream_host:upstream_port``, recording every exchange.

    Use ``start()`` (returns the listening port), ``mark()`` / ``since(mark)`` to slice the
    exchanges of one client run, and ``stop()``. Runs its own asyncio loop in a daemon thread.
    """

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.exchanges: list[Exchange] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._conns = 0
        self._tasks: set[asyncio.Task] = set()
        self._thread: threading.Thread | None = None
        self.port = 0

    def start(self) -> int:
        """Start listening on a free loopback port; returns it."""
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._handle, "127.0.0.1", 0))
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="clients-tap", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the recording relay did not start within 10s")
        return self.port

    def stop(self) -> None:
        """Stop listening, drop the relayed connections still open, end the loop and its thread."""
        async def halt() -> None:
            if self._server is not None:
                self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        if self._thread is None or not self._thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(halt(), self._loop).result(10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            if not self._thread.is_alive():
                self._loop.close()

    def mark(self) -> int:
        """An index to pass to ``since`` later."""
        with self._lock:
            return len(self.exchanges)

    def since(self, mark: int) -> list[Exchange]:
        """The exchanges begun after ``mark`` was taken."""
        with self._lock:
            return list(self.exchanges[mark:])

    async def _handle(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._relay(c_reader, c_writer)
        finally:
            self._tasks.discard(task)
            c_writer.close()

    async def _relay(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        self._conns += 1
        conn = self._conns
        try:
            u_reader, u_writer = await asyncio.open_connection(*self.upstream)
        except OSError as exc:
            self.errors.append(f"conn {conn}: upstream connect failed: {exc}")
            c_writer.close()
            return
        pending: deque[Exchange] = deque()
        bodyless: deque[bool] = deque()
        try:
            await asyncio.gather(
                self._pump(c_reader, u_writer, HttpFramer(False, bodyless), conn, pending, bodyless, False),
                self._pump(u_reader, c_writer, HttpFramer(True, bodyless), conn, pending, bodyless, True),
            )
        finally:
            u_writer.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, framer: HttpFramer,
                    conn: int, pending: deque, bodyless: deque, is_response: bool) -> None:
        parsing = True
        while True:
            try:
                data = await reader.read(65536)
            except (ConnectionError, OSError):
                data = b""
            if not data:
                if parsing:
                    self._apply(framer.eof(), conn, pending, bodyless, is_response)
                if not is_response:  # the client hung up: what it still waited for is abandoned
                    now = time.monotonic()
                    for ex in pending:
                        if not ex.complete and ex.abandoned is None:
                            ex.abandoned = now
                try:
                    if writer.can_write_eof():
                        writer.write_eof()
                except (ConnectionError, OSError, RuntimeError):
                    pass
                return
            if parsing:  # before forwarding, so a request is on record before its response arrives
                try:
                    self._apply(framer.feed(data), conn, pending, bodyless, is_response)
                except Exception as exc:  # noqa: BLE001 - a parse failure must not break the relay
                    parsing = False
                    self.errors.append(f"conn {conn}: cannot parse {'response' if is_response else 'request'}: "
                                       f"{type(exc).__name__}: {exc}")
            try:
                writer.write(data)
                await writer.drain()
            except (ConnectionError, OSError):
                writer.close()  # the opposite pump reads this socket: it ends too
                return

    def _apply(self, events: list[tuple], conn: int, pending: deque, bodyless: deque,
               is_response: bool) -> None:
        for event in events:
            if is_response:
                self._apply_response(event, pending)
            else:
                self._apply_request(event, conn, pending, bodyless)

    def _apply_request(self, event: tuple, conn: int, pending: deque, bodyless: deque) -> None:
        if event[0] == "head":
            method, target = event[1].split(" ")[:2]
            ex = Exchange(conn, method, target, event[2], b"", 0, time.monotonic())
            bodyless.append(method == "HEAD")
            pending.append(ex)
            with self._lock:
                self.exchanges.append(ex)
        elif event[0] == "body":
            ex = pending[-1]
            ex.request_size += len(event[1])
            if len(ex.request_body) < MAX_BODY:
                ex.request_body += event[1]

    def _apply_response(self, event: tuple, pending: deque) -> None:
        if not pending:
            self.errors.append("response without a pending request")
            return
        ex = pending[0]
        if event[0] == "head":
            status = int(event[1].split()[1])
            if status >= 200:
                ex.status, ex.response_headers = status, event[2]
        elif event[0] == "body":
            ex.response_size += len(event[1])
            if len(ex.response_body) < MAX_BODY:
                ex.response_body += event[1]
        elif event[0] == "end":
            ex.complete, ex.finished = True, time.monotonic()
            pending.popleft()
