"""A recording stub endpoint for the replay tests: no model, stdlib HTTP server in a thread.

It records every request (path, headers, JSON body, arrival and finish times) and answers
``/v1/chat/completions`` and ``/v1/messages`` with a scripted SSE stream:

* prompt tokens = :func:`scripted_prompt_tokens` of the body (characters of its messages / 4),
  reused tokens = :func:`scripted_reused_tokens` (``reuse_fraction`` of them, rounded down; a
  quarter by default, so a first turn looks cold; 1.0 scripts a warm server);
* output = ``max_tokens`` tokens when the body has ``ignore_eos: true``, else 2 tokens, each
  ``GEN{i} `` (text that never occurs in a trace), one event per token ``token_delay_s`` apart,
  after ``first_delay_s``;
* OpenAI: a role chunk, content chunks, a ``finish_reason`` chunk, a usage chunk, ``[DONE]``;
  Anthropic: ``message_start``, ``ping``, one text block, ``message_delta`` with usage,
  ``message_stop``.

``GET /metrics`` serves ``freetoken_`` families when ``freetoken`` is set: every finished request
adds 3 expert hits (over two layers), 1 miss, 2 checkpoint saves and 1 load, and every request
received one to ``freetoken_requests_added_total`` (so a second run against the same stub starts
warm). ``memory`` (a dict) is served as ``GET /v1/freetoken/memory`` when ``freetoken`` is set
(404 otherwise).
``fail_on`` makes the n-th request (0-based) answer HTTP 500. ``api_key`` makes every route
answer 401 unless the request carries it (``Authorization: Bearer`` or ``x-api-key``), as
``freetoken serve --api-key`` does; ``models_status`` other than 200 makes ``GET /v1/models``
answer that status (a server that is not OpenAI-compatible). ``gets`` logs the GET paths.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GENERATED = "GEN"


def scripted_prompt_tokens(body: dict) -> int:
    """The stub's prompt token count for a request body."""
    return len(json.dumps([body.get("system"), body.get("messages")])) // 4


def scripted_reused_tokens(body: dict, fraction: float = 0.25) -> int:
    """The stub's reused (cached) prompt tokens for a request body (``fraction`` of the prompt,
    rounded down; the stub's ``reuse_fraction``)."""
    return int(scripted_prompt_tokens(body) * fraction)


@dataclass
class StubState:
    """Settings and the request log (shared with the handler threads)."""

    first_delay_s: float = 0.0
    token_delay_s: float = 0.001
    freetoken: bool = True
    fail_on: int | None = None
    api_key: str | None = None
    models_status: int = 200
    reuse_fraction: float = 0.25
    memory: dict | None = None
    log: list[dict] = field(default_factory=list)
    gets: list[str] = field(default_factory=list)
    finished: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(BaseHTTPRequestHandler):
    state: StubState

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, status: int, ctype: str, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _refused(self) -> bool:
        """Answer 401 when an API key is required and missing or wrong (True: answered)."""
        key = self.state.api_key
        if key is None:
            return False
        bearer = self.headers.get("authorization", "")
        if bearer == f"Bearer {key}" or self.headers.get("x-api-key") == key:
            return False
        self._send(401, "application/json", b'{"error": {"message": "invalid API key"}}')
        return True

    def do_GET(self) -> None:
        self.state.gets.append(self.path)
        if self._refused():
            return
        if self.path == "/v1/models" and self.state.models_status != 200:
            self._send(self.state.models_status, "text/html", b"<html>no such page</html>")
        elif self.path == "/v1/models":
            self._send(200, "application/json", b'{"data": [{"id": "stub-model"}]}')
        elif self.path == "/v1/freetoken/memory" and self.state.freetoken \
                and self.state.memory is not None:
            self._send(200, "application/json", json.dumps(self.state.memory).encode())
        elif self.path == "/metrics" and self.state.freetoken:
            n = self.state.finished
            text = (f"freetoken_requests_added_total {len(self.state.log)}\n"
                    f"freetoken_moe_hits_total{{layer=\"0\"}} {2 * n}\n"
                    f"freetoken_moe_hits_total{{layer=\"1\"}} {n}\n"
                    f"freetoken_moe_misses_total{{layer=\"0\"}} {n}\n"
                    f"freetoken_prefix_checkpoint_saves_total {2 * n}\n"
                    f"freetoken_prefix_checkpoint_loads_total {n}\n"
                    f"freetoken_prefix_checkpoint_device_count 4\n")
            self._send(200, "text/plain", text.encode())
        else:
            self._send(404, "text/plain", b"not found")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if self._refused():
            return
        with self.state.lock:
            index = len(self.state.log)
            entry = {"path": self.path, "headers": dict(self.headers), "body": body,
                     "t_start": time.perf_counter(), "t_end": None}
            self.state.log.append(entry)
        if self.state.fail_on == index:
            self._finish(entry)
            self._send(500, "application/json", b'{"error": {"message": "scripted failure"}}')
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        stream = self._anthropic if self.path == "/v1/messages" else self._openai
        stream(body, entry)

    def _finish(self, entry: dict) -> None:
        """Mark the request finished before its last event, so that a client that scrapes
        /metrics right after the stream sees it counted."""
        with self.state.lock:
            entry["t_end"] = time.perf_counter()
            self.state.finished += 1

    def _event(self, obj: dict | str, name: str | None = None) -> None:
        data = obj if isinstance(obj, str) else json.dumps(obj)
        head = f"event: {name}\n" if name else ""
        self.wfile.write(f"{head}data: {data}\n\n".encode())
        self.wfile.flush()

    def _tokens(self, body: dict) -> list[str]:
        n = body["max_tokens"] if body.get("ignore_eos") else 2
        time.sleep(self.state.first_delay_s)
        return [f"{GENERATED}{i} " for i in range(n)]

    def _openai(self, body: dict, entry: dict) -> None:
        def chunk(delta: dict, finish: str | None = None) -> dict:
            return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        self._event(chunk({"role": "assistant", "content": ""}))
        tokens = self._tokens(body)
        for text in tokens:
            self._event(chunk({"content": text}))
            time.sleep(self.state.token_delay_s)
        self._event(chunk({}, "length"))
        prompt = scripted_prompt_tokens(body)
        self._event({"choices": [], "usage": {
            "prompt_tokens": prompt, "completion_tokens": len(tokens),
            "prompt_tokens_details": {"cached_tokens": scripted_reused_tokens(
                body, self.state.reuse_fraction)}}})
        self._finish(entry)
        self._event("[DONE]")

    def _anthropic(self, body: dict, entry: dict) -> None:
        prompt = scripted_prompt_tokens(body)
        reused = scripted_reused_tokens(body, self.state.reuse_fraction)
        self._event({"type": "message_start", "message": {"usage": {
            "input_tokens": prompt, "output_tokens": 0}}}, "message_start")
        self._event({"type": "ping"}, "ping")
        tokens = self._tokens(body)
        self._event({"type": "content_block_start", "index": 0,
                     "content_block": {"type": "text", "text": ""}}, "content_block_start")
        for text in tokens:
            self._event({"type": "content_block_delta", "index": 0,
                         "delta": {"type": "text_delta", "text": text}}, "content_block_delta")
            time.sleep(self.state.token_delay_s)
        self._event({"type": "content_block_stop", "index": 0}, "content_block_stop")
        self._event({"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": {
            "input_tokens": prompt - reused, "cache_read_input_tokens": reused,
            "cache_creation_input_tokens": 0, "output_tokens": len(tokens)}}, "message_delta")
        self._finish(entry)
        self._event({"type": "message_stop"}, "message_stop")


class StubServer:
    """``with StubServer() as stub: stub.url ...``; ``stub.state.log`` holds the requests."""

    def __init__(self, **settings) -> None:
        self.state = StubState(**settings)
        handler = type("Handler", (_Handler,), {"state": self.state})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> StubServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    @property
    def bodies(self) -> list[dict]:
        """Request bodies in arrival order."""
        return [e["body"] for e in self.state.log]
