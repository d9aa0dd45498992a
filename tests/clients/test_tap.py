"""The recording relay: bytes pass unchanged and every exchange is recorded with correct framing
(Content-Length, chunked SSE, HEAD without body, several requests on one keep-alive connection)."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest

from .tap import Tap

SSE = ["data: {\"a\": 1}\n\n", "data: {\"b\": \"x\\ny\"}\n\n", "data: [DONE]\n\n"]


class _Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self.send_response(404)
        self.send_header("Content-Length", "17")  # as for GET, but no body follows (RFC 9110 9.3.2)
        self.end_headers()

    def do_GET(self) -> None:
        body = b'{"status": "ok"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if request.get("slow"):  # one event, then a stream that takes its time
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            data = SSE[0].encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
            threading.Event().wait(2.0)
            return
        if not request.get("stream"):
            body = json.dumps({"echo": request}).encode()
            self.send_response(201)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in SSE:
            data = event.encode()
            self.wfile.write(b"%x;ext=1\r\n%s\r\n" % (len(data), data))
        self.wfile.write(b"0\r\nX-Trailer: t\r\n\r\n")


@pytest.fixture()
def relay() -> Iterator[Tap]:
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    tap = Tap(upstream.server_address[1])
    tap.start()
    yield tap
    tap.stop()
    upstream.shutdown()


def _wait_complete(tap: Tap, count: int) -> None:
    for _ in range(200):
        exchanges = tap.since(0)
        if len(exchanges) == count and all(ex.complete for ex in exchanges):
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"relay recorded {[(ex.target, ex.complete) for ex in tap.since(0)]}")


def test_relay_keeps_bytes_and_records_each_exchange(relay: Tap) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", relay.port, timeout=10)
    conn.request("HEAD", "/")
    head = conn.getresponse()
    assert (head.status, head.read()) == (404, b"")
    conn.request("POST", "/v1/chat/completions?x=1", body=json.dumps({"model": "m", "stream": True}),
                 headers={"Content-Type": "application/json"})
    streamed = conn.getresponse()
    assert (streamed.status, streamed.read().decode()) == (200, "".join(SSE))
    conn.request("POST", "/v1/messages", body=json.dumps({"model": "n", "messages": []}))
    plain = conn.getresponse()
    assert (plain.status, json.loads(plain.read())) == (201, {"echo": {"model": "n", "messages": []}})
    conn.request("GET", "/health")
    assert conn.getresponse().read() == b'{"status": "ok"}'
    conn.close()

    _wait_complete(relay, 4)
    head_ex, sse_ex, plain_ex, get_ex = relay.since(0)
    assert {ex.conn for ex in (head_ex, sse_ex, plain_ex, get_ex)} == {1}
    assert (head_ex.method, head_ex.target, head_ex.status, head_ex.response_size) == ("HEAD", "/", 404, 0)
    assert (sse_ex.path, sse_ex.query, sse_ex.model, sse_ex.stream, sse_ex.status) == (
        "/v1/chat/completions", "x=1", "m", True, 200)
    assert sse_ex.request_size == len(json.dumps({"model": "m", "stream": True}))
    assert sse_ex.response_text() == "".join(SSE)
    assert (plain_ex.model, plain_ex.stream, plain_ex.status) == ("n", None, 201)
    assert get_ex.response_text() == '{"status": "ok"}'
    assert relay.mark() == 4 and relay.since(3) == [get_ex]
    assert relay.errors == []


def test_relay_records_parallel_connections_separately(relay: Tap) -> None:
    conns = [http.client.HTTPConnection("127.0.0.1", relay.port, timeout=10) for _ in range(2)]
    for i, conn in enumerate(conns):
        conn.request("POST", f"/c{i}", body=json.dumps({"model": f"m{i}"}))
    bodies = [json.loads(conn.getresponse().read()) for conn in conns]
    assert bodies == [{"echo": {"model": "m0"}}, {"echo": {"model": "m1"}}]
    for conn in conns:
        conn.close()
    _wait_complete(relay, 2)
    by_target = {ex.target: ex for ex in relay.since(0)}
    assert {t: (ex.model, ex.status) for t, ex in by_target.items()} == {"/c0": ("m0", 201), "/c1": ("m1", 201)}
    assert by_target["/c0"].conn != by_target["/c1"].conn


def test_a_client_that_hangs_up_mid_stream_abandons_the_exchange(relay: Tap) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", relay.port, timeout=10)
    conn.request("POST", "/v1/chat/completions", body=json.dumps({"stream": True, "slow": True}),
                 headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200 and response.read1(64).startswith(b"data:")
    before = time.monotonic()
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    for _ in range(200):
        (ex,) = relay.since(0)
        if ex.abandoned is not None:
            break
        threading.Event().wait(0.01)
    assert (ex.complete, ex.status) == (False, 200)
    assert ex.abandoned is not None and ex.abandoned >= before
