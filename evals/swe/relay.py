"""A recording HTTP relay between an agent and the endpoint it is evaluated against.

The relay listens on ``127.0.0.1:<port>``, forwards every request to the endpoint (same method,
path, headers and body; ``Accept-Encoding: identity`` so the relay can read the answer) and
streams the answer back as it arrives. It timestamps each exchange and reads the token usage out
of a copy of the answer (``calls.CallRecord``: TTFT and decode tok/s per model call, defined there
for non-streamed and streamed answers).

Framing follows RFC 9112: request bodies by Content-Length or chunked coding; answers are sent
back with the endpoint's Content-Length when it stated one, else re-chunked. Only the standard
library is used (``http.server``, ``http.client``), one thread per client connection.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from evals.swe.calls import CallRecord

HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
              "upgrade", "content-length", "host", "accept-encoding"}


class Relay:
    """Record-and-forward relay from ``127.0.0.1:<port>`` to ``upstream`` (an ``http(s)://host[:port]``
    base URL; a path prefix in it is prepended to every forwarded path).

    ``start()`` returns the listening port; ``calls`` lists a ``CallRecord`` per request in arrival
    order; ``stop()`` closes the listener. ``timeout`` (seconds) bounds each upstream read.

    Raises:
        ValueError: ``upstream`` is not an http or https URL with a host.
    """

    def __init__(self, upstream: str, timeout: float = 600.0) -> None:
        parts = urlsplit(upstream)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"endpoint {upstream!r} is not an http:// or https:// URL with a host")
        self.scheme = parts.scheme
        self.netloc = parts.netloc
        self.prefix = parts.path.rstrip("/")
        self.timeout = timeout
        self.calls: list[CallRecord] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``: where the agent is pointed."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> int:
        """Listen on a free loopback port and serve in a daemon thread; returns the port."""
        relay = self

        class Handler(_RelayHandler):
            owner = relay

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="swe-relay", daemon=True)
        self._thread.start()
        return self.port

    def stop(self) -> None:
        """Stop accepting and close the listener (idempotent)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def model_calls(self) -> list[CallRecord]:
        """The records of generation requests, in arrival order."""
        with self._lock:
            return [c for c in self.calls if c.is_model_call]

    def _new_record(self, method: str, path: str, body: bytes) -> CallRecord:
        try:
            request = json.loads(body) if body else None
        except ValueError:
            request = None
        request = request if isinstance(request, dict) else {}
        model = request.get("model") if isinstance(request.get("model"), str) else None
        with self._lock:
            record = CallRecord(len(self.calls), method, path, bool(request.get("stream")), model,
                                time.monotonic())
            self.calls.append(record)
        return record

    def _connection(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return cls(self.netloc, timeout=self.timeout)


class _RelayHandler(BaseHTTPRequestHandler):
    """One client connection: each request is forwarded upstream on a fresh connection."""

    owner: Relay
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - BaseHTTPRequestHandler API
        """Silent: the records are the log."""

    def do_GET(self) -> None:  # noqa: N802 - BaseHTTPRequestHandler API
        self._relay()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_GET

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _relay(self) -> None:
        body = self._read_body()
        record = self.owner._new_record(self.command, self.path, body)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["Host"] = self.owner.netloc
        headers["Accept-Encoding"] = "identity"
        if body or self.command in ("POST", "PUT", "PATCH"):
            headers["Content-Length"] = str(len(body))
        conn = self.owner._connection()
        try:
            try:
                conn.request(self.command, self.owner.prefix + self.path, body=body or None, headers=headers)
                upstream = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                record.error = f"upstream unreachable: {type(exc).__name__}: {exc}"
                record.total_s = time.monotonic() - record.started
                self._fail(502, record.error)
                return
            record.status = upstream.status
            record.head_s = time.monotonic() - record.started
            self._forward(upstream, record)
        finally:
            conn.close()

    def _forward(self, upstream: http.client.HTTPResponse, record: CallRecord) -> None:
        length = upstream.getheader("Content-Length")
        no_body = self.command == "HEAD" or upstream.status in (204, 304) or upstream.status < 200
        chunked = length is None and not no_body
        self.send_response_only(upstream.status, upstream.reason)
        for key, value in upstream.getheaders():
            if key.lower() not in HOP_BY_HOP:
                self.send_header(key, value)
        if length is not None:
            self.send_header("Content-Length", length)
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            while not no_body:
                try:
                    chunk = upstream.read1(65536)
                except (OSError, http.client.HTTPException) as exc:
                    record.error = f"upstream read failed: {type(exc).__name__}: {exc}"
                    self.close_connection = True
                    break
                if not chunk:
                    break
                now = time.monotonic()
                record.feed(chunk, now)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
                self.wfile.flush()
            if chunked and record.error is None:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
        except OSError as exc:
            record.error = f"client went away: {type(exc).__name__}: {exc}"
            self.close_connection = True
        record.total_s = time.monotonic() - record.started
        record.finish()

    def _fail(self, status: int, message: str) -> None:
        payload = json.dumps({"error": {"message": message, "type": "relay_error"}}).encode()
        try:
            self.send_response_only(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except OSError:
            self.close_connection = True
