"""Test doubles for ``evals/run_swe.py``: a stub OpenAI-compatible server and a fake ``mini``.

``StubServer`` answers ``GET /v1/models`` with one model card and ``POST /v1/chat/completions``
with a fixed chat completion (known id, usage and delay), or, for ``"stream": true``, a scripted
SSE stream whose events are spaced by known delays; it records every request it received, bytes
included. ``write_fake_mini`` writes an executable that behaves like ``mini -o TRAJ`` as far as
``run_swe`` can see: it calls the model through ``OPENAI_BASE_URL`` the way litellm does, can edit
the repository in its working directory, and writes a trajectory in mini's format.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MODEL = "stub-model"
USAGE = [(300, 0, 7), (340, 296, 11)]  # (prompt, cached, completion) tokens of the n-th completion
REPLY_DELAY_S = 0.05
STREAM_EVENTS = [  # (delay before the event in seconds, data), the stream test's script
    (0.0, {"id": "chatcmpl-s", "choices": [{"index": 0, "delta": {"role": "assistant"}}]}),
    (0.15, {"id": "chatcmpl-s", "choices": [{"index": 0, "delta": {"content": "Hel"}}]}),
    (0.1, {"id": "chatcmpl-s", "choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]}),
    (0.0, {"id": "chatcmpl-s", "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 5,
                                                         "prompt_tokens_details": {"cached_tokens": 4}}}),
]
# The bundled task's reference fix (tally/stats.py): average the two middle values for even lengths.
FIX_OLD = "    middle = len(items) // 2\n    return items[middle]\n"
FIX_NEW = ("    middle = len(items) // 2\n    if len(items) % 2:\n        return items[middle]\n"
           "    return (items[middle - 1] + items[middle]) / 2\n")


@dataclass
class Received:
    """One request as the stub saw it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class StubServer:
    """Threaded stub of an OpenAI-compatible server on a free loopback port.

    ``fail_status``: when set, every chat completion is answered with that status and an OpenAI
    error body. Completions are numbered from 0 in arrival order (ids ``chatcmpl-stub-<n>``,
    usage ``USAGE[n % 2]``).
    """

    fail_status: int | None = None
    received: list[Received] = field(default_factory=list)
    stream_bytes: bytes = b""
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> "StubServer":
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _body(self) -> bytes:
                if "chunked" in self.headers.get("Transfer-Encoding", ""):
                    data = b""
                    while (size := int(self.rfile.readline().strip(), 16)) > 0:
                        data += self.rfile.read(size)
                        self.rfile.readline()
                    self.rfile.readline()
                    return data
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                stub.received.append(Received("GET", self.path, dict(self.headers), b""))
                if self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [
                        {"id": MODEL, "object": "model", "max_model_len": 4096, "max_tokens": 64}]})
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:  # noqa: N802
                body = self._body()
                stub.received.append(Received("POST", self.path, dict(self.headers), body))
                request = json.loads(body)
                if stub.fail_status is not None:
                    self._send(stub.fail_status, {"error": {"message": "stub failure", "type": "server_error"}})
                    return
                if request.get("stream"):
                    self._stream()
                    return
                n = sum(1 for r in stub.received if r.method == "POST") - 1
                prompt, cached, completion = USAGE[n % 2]
                time.sleep(REPLY_DELAY_S)
                self._send(200, {
                    "id": f"chatcmpl-stub-{n}", "object": "chat.completion", "created": 1, "model": MODEL,
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": f"reply {n}"}}],
                    "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                              "total_tokens": prompt + completion,
                              "prompt_tokens_details": {"cached_tokens": cached}}})

            def _stream(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                events = [f"data: {json.dumps(data)}\n\n".encode() for _, data in STREAM_EVENTS]
                events.append(b"data: [DONE]\n\n")
                delays = [d for d, _ in STREAM_EVENTS] + [0.0]
                for delay, event in zip(delays, events):
                    time.sleep(delay)
                    stub.stream_bytes += event
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def posts(self) -> list[Received]:
        return [r for r in self.received if r.method == "POST"]


FAKE_MINI = r'''#!{python}
"""Fake mini ({mode}): two model calls through OPENAI_BASE_URL, then a mini-format trajectory."""
import json, os, sys, time, urllib.request

MODE = {mode!r}
argv = sys.argv[1:]
out = argv[argv.index("-o") + 1]
task = argv[argv.index("-t") + 1]
specs = [argv[i + 1] for i, a in enumerate(argv) if a == "-c"]
child = None
if MODE == "sleep":  # a grandchild in the agent's process group, as mini's bash commands are
    import subprocess
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]).pid
with open({seen!r} + ".tmp", "w") as f:
    json.dump({{"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "pid": os.getpid(),
               "child": child}}, f)
os.replace({seen!r} + ".tmp", {seen!r})
if MODE == "sleep":
    time.sleep(600)
messages = [{{"role": "system", "content": "sys"}}, {{"role": "user", "content": task}}]
model = os.environ["MSWEA_MODEL_NAME"].split("/", 1)[1]
n_calls = 1 if MODE == "crash" else 2
for i in range(n_calls):
    body = json.dumps({{"model": model, "messages": [{{"role": m["role"], "content": m["content"]}}
                                                    for m in messages],
                        "tools": [{{"type": "function", "function": {{"name": "bash"}}}}]}}).encode()
    req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
                                 headers={{"Content-Type": "application/json",
                                          "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}})
    try:
        with urllib.request.urlopen(req) as resp:
            response = json.load(resp)
    except urllib.error.HTTPError as exc:
        print("model call failed:", exc.code, exc.read().decode(), file=sys.stderr)
        sys.exit(1)
    if MODE == "fix" and i == 0:
        path = os.path.join("tally", "stats.py")
        text = open(path).read()
        open(path, "w").write(text.replace({old!r}, {new!r}))
        messages.append({{"role": "assistant", "content": response["choices"][0]["message"]["content"],
                         "extra": {{"actions": [{{"command": "sed -i ... tally/stats.py"}}],
                                   "response": response}}}})
        messages.append({{"role": "tool", "content": "{{\"returncode\": 0}}"}})
    else:
        messages.append({{"role": "user", "content": "Tool call error",
                         "extra": {{"interrupt_type": "FormatError", "response": response}}}})
if MODE == "crash":
    print("Traceback: fake crash", file=sys.stderr)
    sys.exit(3)
status = "Submitted" if MODE == "fix" else "LimitsExceeded"
messages.append({{"role": "exit", "content": status, "extra": {{"exit_status": status}}}})
with open(out, "w") as f:
    json.dump({{"info": {{"exit_status": status, "mini_version": "fake-1.0",
                         "model_stats": {{"api_calls": n_calls, "instance_cost": 0.0}}}},
               "messages": messages, "trajectory_format": "mini-swe-agent-1.1"}}, f)
'''


def write_fake_mini(folder: Path, mode: str) -> tuple[Path, Path]:
    """An executable fake ``mini`` in ``folder`` and the file where it records its argv, cwd and env.

    ``mode``: ``"noop"`` (two calls, each a format error, ``LimitsExceeded``), ``"fix"`` (applies
    the reference fix after the first call, ``Submitted``), ``"crash"`` (one call, exit 3, no
    trajectory), ``"sleep"`` (starts a sleeping child, then hangs until killed). The record
    (written atomically) has ``pid`` and, in ``"sleep"`` mode, the child's ``child`` pid.
    """
    assert mode in ("noop", "fix", "crash", "sleep"), mode
    folder.mkdir(parents=True, exist_ok=True)
    seen = folder / f"seen-{mode}.json"
    script = folder / f"mini-{mode}"
    script.write_text(FAKE_MINI.format(python=sys.executable, mode=mode, seen=str(seen), old=FIX_OLD,
                                       new=FIX_NEW))
    script.chmod(0o755)
    return script, seen
