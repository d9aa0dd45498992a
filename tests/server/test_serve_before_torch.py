"""``freetoken serve`` answers ``/health`` before torch is imported: the server runs in a child
process whose ``import torch`` waits until the test opens a gate file, so a 503 "loading"
answer seen while the gate is shut comes from a server that has not imported torch yet (no
timing involved). Opening the gate lets the load go on to a 200."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.clients.server import REPO_ROOT, ServerProcess, free_port

# Runs ``freetoken`` with a meta-path finder in front that holds any import of torch (from any
# thread) until the file $FREETOKEN_TEST_TORCH_GATE exists.
GATED_MAIN = """
import os, sys, time

class TorchGate:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            print("[gate] torch import waits", flush=True)
            while not os.path.exists(os.environ["FREETOKEN_TEST_TORCH_GATE"]):
                time.sleep(0.05)
        return None

sys.meta_path.insert(0, TorchGate())
from freetoken.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _health(http: httpx.Client, server: ServerProcess, deadline: float) -> httpx.Response:
    while time.monotonic() < deadline:
        assert server.proc.poll() is None, server.log_tail()
        try:
            return http.get("/health")
        except httpx.TransportError:
            time.sleep(0.05)
    raise AssertionError(f"/health never answered:\n{server.log_tail()}")


def test_health_answers_before_torch_is_imported(tiny_checkpoint, tmp_path: Path) -> None:
    gate = tmp_path / "torch-gate"
    port = free_port()
    cmd = [sys.executable, "-c", GATED_MAIN, "serve", "--model", str(tiny_checkpoint("qwen3_moe")),
           "--port", str(port), "--served-model-name", "tiny", "--max-output-tokens", "8"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", FREETOKEN_TEST_TORCH_GATE=str(gate))
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT,
                                start_new_session=True)
    server = ServerProcess(proc, port, log_path, "tiny", 8)
    try:
        with httpx.Client(base_url=server.base_url, timeout=30) as http:
            r = _health(http, server, time.monotonic() + 120)
            assert not gate.exists()
            assert r.status_code == 503, r.text
            body = r.json()
            assert body["status"] == "loading"
            assert body["progress"]["stage"] in ("starting", "profile")
            assert body["progress"]["done_bytes"] is None
            log = log_path.read_text()
            assert "[gate] torch import waits" in log  # the loader thread is held at the gate
            assert log.index("listening on") < log.index("[gate] torch import waits")
            gate.touch()
            server._wait_healthy(120)
            assert http.get("/health").json()["status"] == "ok"
    finally:
        assert server.stop() == 0, server.log_tail()
