"""``freetoken serve --model DST`` on a packed checkpoint: ``/health`` reports the load's bytes
(the other weights and the banks) while it loads, then the server answers as it does from the
safetensors source."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx

from freetoken.launch import TEST_LOAD_DELAY_ENV
from freetoken.models.loader import Checkpoint
from freetoken.packed.manifest import read_manifest
from tests.clients.server import REPO_ROOT, ServerProcess, free_port

CHAT = {"model": "tiny", "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "user", "content": "Write a haiku about disks."}]}


def _start_loading(tmp_path, model) -> ServerProcess:
    port = free_port()
    cmd = [sys.executable, "-m", "freetoken", "serve", "--port", str(port), "--served-model-name",
           "tiny", "--model", str(model), "--moe-backend", "offload"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", **{TEST_LOAD_DELAY_ENV: "3"})
    with open(tmp_path / "packed.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT,
                                start_new_session=True)
    return ServerProcess(proc, port, tmp_path / "packed.log", "tiny", 8)


def test_serve_loads_a_packed_checkpoint_with_progress(packed_pair, tmp_path) -> None:
    src, dst = packed_pair("qwen3_moe-bf16")
    checkpoint = Checkpoint(dst)
    total = sum(checkpoint.nbytes(n) for n in checkpoint.files) + read_manifest(dst).nbytes
    server = _start_loading(tmp_path, dst)
    try:
        with httpx.Client(base_url=server.base_url, timeout=30) as http:
            deadline = time.monotonic() + 120
            while True:
                assert time.monotonic() < deadline and server.proc.poll() is None, \
                    server.log_tail()
                try:
                    r = http.get("/health")
                except httpx.TransportError:
                    time.sleep(0.1)
                    continue
                if r.status_code == 503 and r.json()["progress"]["done_bytes"] is not None:
                    break
                time.sleep(0.1)
            progress = r.json()["progress"]
            assert progress["total_bytes"] == total and 0 < progress["done_bytes"] < total
            server._wait_healthy(120)
            packed = http.post("/v1/chat/completions", json=CHAT)
            assert packed.status_code == 200, packed.text
    finally:
        assert server.stop() == 0, server.log_tail()
    plain = ServerProcess.start(tmp_path / "plain.log", served_model_name="tiny",
                                extra_args=("--model", str(src), "--moe-backend", "offload"))
    try:
        with httpx.Client(base_url=plain.base_url, timeout=30) as http:
            reference = http.post("/v1/chat/completions", json=CHAT)
    finally:
        plain.stop()
    text = packed.json()["choices"][0]["message"]["content"]
    assert text == reference.json()["choices"][0]["message"]["content"]
