"""``freetoken serve`` answers while the model loads: a real server subprocess on the embedded tiny
model, slowed by the test-only ``FREETOKEN_TEST_LOAD_DELAY_S`` (the loader sleeps after its first
tensor), then a checkpoint that fails to load after the port is bound."""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
from safetensors import safe_open

from freetoken.launch import TEST_LOAD_DELAY_ENV
from tests.clients.server import REPO_ROOT, ServerProcess, free_port

DELAY_S = 12.0
LOADING = r"the model is loading \(weights {pct}, \d+ s so far\); retry in 5 s"


def _start(log_path: Path, *args: str, delay: float | None = None) -> ServerProcess:
    port = free_port()
    cmd = [sys.executable, "-m", "freetoken", "serve", "--port", str(port),
           "--served-model-name", "tiny", "--max-output-tokens", "8", *args]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop(TEST_LOAD_DELAY_ENV, None)
    if delay is not None:
        env[TEST_LOAD_DELAY_ENV] = str(delay)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT,
                                start_new_session=True)
    return ServerProcess(proc, port, log_path, "tiny", 8)


def _health_while_loading(http: httpx.Client, server: ServerProcess) -> httpx.Response:
    """The first ``/health`` answer that shows tensors being read (the loader then sleeps)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert server.proc.poll() is None, server.log_tail()
        try:
            r = http.get("/health")
        except httpx.TransportError:
            time.sleep(0.1)
            continue
        assert r.status_code == 503, r.text
        if r.json()["progress"]["done_bytes"] is not None:
            return r
        time.sleep(0.1)
    raise AssertionError(f"never saw the weights stage:\n{server.log_tail()}")


def _checkpoint_bytes(path: Path) -> int:
    """Bytes of every tensor stored in ``path``'s single safetensors file (the tiny model loads
    them all)."""
    itemsize = {"BF16": 2, "F16": 2, "F32": 4}
    total = 0
    with safe_open(path / "model.safetensors", framework="pt") as f:
        for name in f.keys():
            piece = f.get_slice(name)
            total += math.prod(piece.get_shape()) * itemsize[piece.get_dtype()]
    return total


def test_serve_answers_503_while_loading_then_serves(tmp_path: Path) -> None:
    from freetoken.models.tiny import default_model_path

    total = _checkpoint_bytes(default_model_path())
    server = _start(tmp_path / "serve.log", delay=DELAY_S)
    try:
        with httpx.Client(base_url=server.base_url, timeout=30) as http:
            r = _health_while_loading(http, server)
            assert r.headers["retry-after"] == "5"
            body = r.json()
            progress = body["progress"]
            done = progress["done_bytes"]
            assert body == {"status": "loading", "progress": {
                "stage": "weights", "elapsed_s": progress["elapsed_s"], "done_bytes": done,
                "total_bytes": total, "fraction": round(done / total, 4)}}
            assert 0 < done < total and 0 <= progress["elapsed_s"] < 120
            pct = f"{done / total:.0%}"

            # a scraper sees the load (not a 503); the operator page loads and shows it
            r = http.get("/metrics")
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
            gauges = dict(line.rsplit(" ", 1) for line in r.text.splitlines()
                          if not line.startswith("#"))
            assert gauges["freetoken_engine_healthy"] == "0"
            assert gauges['freetoken_loading{stage="weights"}'] == "1"
            assert 0 < float(gauges["freetoken_loading_fraction"]) <= 1
            assert float(gauges["freetoken_loading_seconds"]) >= 0
            r = http.get("/ui", follow_redirects=True)
            assert r.status_code == 200 and 'id="health"' in r.text
            assert http.get("/ui/app.js").status_code == 200

            chat = {"model": "tiny", "max_tokens": 4, "temperature": 0,
                    "messages": [{"role": "user", "content": "hi"}]}
            r = http.post("/v1/chat/completions", json=chat)
            assert (r.status_code, r.headers.get("retry-after")) == (503, "5"), r.text
            err = r.json()["error"]
            assert re.fullmatch(LOADING.format(pct=pct), err["message"]), err
            assert err == {"message": err["message"], "type": "server_error", "param": None,
                           "code": "model_loading"}

            r = http.post("/v1/messages", json={"model": "tiny", "max_tokens": 4,
                                                "messages": [{"role": "user", "content": "hi"}]})
            assert (r.status_code, r.headers["retry-after"]) == (529, "5")
            body = r.json()
            assert body == {"type": "error", "error": {"type": "overloaded_error",
                                                       "message": body["error"]["message"]}}
            assert re.fullmatch(LOADING.format(pct=pct), body["error"]["message"]), body

            server._wait_healthy(DELAY_S + 120)
            r = http.get("/health")
            assert (r.status_code, r.json()) == (200, {"status": "ok"})
            r = http.post("/v1/chat/completions", json=chat)
            assert r.status_code == 200, r.text
            answer = r.json()
            assert answer["object"] == "chat.completion" and answer["model"] == "tiny"
            assert answer["usage"]["completion_tokens"] >= 1
    finally:
        code = server.stop()
    log = server.log_tail(100_000)
    assert code == 0, log
    order = [log.find(m) for m in ("[freetoken] loading ", "listening on",
                                   "POST /v1/chat/completions HTTP/1.1\" 503",
                                   "[freetoken] loaded qwen3_next in ", "[freetoken] model 'tiny' ready",
                                   "GET /health HTTP/1.1\" 200", "[freetoken] stopped")]
    assert all(p >= 0 for p in order) and order == sorted(order), log
    assert "GET /health HTTP/1.1\" 503" not in log  # polls while loading are not logged


def test_a_checkpoint_that_fails_after_binding_exits_2_with_the_error(tmp_path: Path) -> None:
    from freetoken.models.tiny import default_model_path

    bad = tmp_path / "truncated"
    shutil.copytree(default_model_path(), bad)
    weights = bad / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    server = _start(tmp_path / "serve.log", "--model", str(bad))
    try:
        code = server.proc.wait(120)
    finally:
        server.stop()
    lines = server.log_tail(100_000).splitlines()
    errors = [line for line in lines if line.startswith("[freetoken] error:")]
    assert code == 2, "\n".join(lines)
    assert errors == [
        f"[freetoken] error: cannot load {bad}: {weights}: not a readable safetensors file "
        "(truncated or corrupt: Error while deserializing header: incomplete metadata, file not "
        "fully covered)"]
    listening = next(i for i, line in enumerate(lines) if "listening on" in line)
    assert listening < lines.index(errors[0])  # it failed after the port answered
    assert not any("Traceback" in line for line in lines)


def test_serve_prints_the_memory_plan_and_serves_it(tmp_path: Path) -> None:
    """A real start prints the plan as one table before loading, sizes the defaults from it (on
    this machine the tiny model's host checkpoint tier is far below the old fixed 16 GiB) and
    serves it as ``plan`` in ``GET /v1/freetoken/memory``."""
    from freetoken.units import format_bytes

    server = _start(tmp_path / "serve.log")
    try:
        server._wait_healthy(120)
        with httpx.Client(base_url=server.base_url, timeout=30) as http:
            plan = http.get("/v1/freetoken/memory").json()["plan"]
    finally:
        code = server.stop()
    lines = server.log_tail(100_000).splitlines()
    assert code == 0, "\n".join(lines)
    assert plan["device"] == "cpu" and not plan["kv_explicit"]
    assert 0 < plan["weights_device"] < 2**30  # the tiny model: tens of MiB
    pool = plan["host_available"] - plan["weights_device"] - plan["reserve_host"]
    assert plan["reserve_host"] == max(plan["host_total"] // 10, 2**30)
    assert plan["kv_cache_bytes"] == plan["checkpoint_host_bytes"] == pool // 4
    assert plan["host_left"] == pool - 2 * (pool // 4) > 0
    assert plan["checkpoint_host_bytes"] < plan["host_available"] // 4 < 16 * 2**30
    start = lines.index("[freetoken] memory plan:")
    assert lines[start + 1:start + 8] == [
        f"[freetoken]   {what:<13}{where:<18}{format_bytes(size) if size is not None else '-':>11}"
        f"  {how}".rstrip() for what, where, size, how in [
            ("available", "host", plan["host_available"],
             f"of {format_bytes(plan['host_total'])}"),
            ("weights", "host (cpu device)", plan["weights_device"], "all tensors"),
            ("KV pool", "host (cpu device)", plan["kv_cache_bytes"], "cap: 25% of the pool"),
            ("checkpoints", "host (cpu device)", None, "8 slots"),
            ("checkpoints", "host", plan["checkpoint_host_bytes"], "25% of the host pool"),
            ("reserve", "host", plan["reserve_host"], "max(10% of total, 1 GiB)"),
            ("left", "host", plan["host_left"], "")]]
    assert start < next(i for i, line in enumerate(lines) if "listening on" in line)
    ckpt_mib = f"{plan['checkpoint_host_bytes'] / 2**20:.0f} MiB host tier"
    assert any(line.startswith("[freetoken] KV cache:") and ckpt_mib in line for line in lines)


def test_only_loading_health_polls_leave_the_access_log() -> None:
    from freetoken.server.loading import QuietLoadingPolls

    def record(method: str, path: str, status: int) -> logging.LogRecord:
        return logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1,
                                 '%s - "%s %s HTTP/%s" %d',
                                 ("127.0.0.1:5000", method, path, "1.1", status), None)

    quiet = QuietLoadingPolls()
    assert not quiet.filter(record("GET", "/health", 503))
    assert quiet.filter(record("GET", "/health", 200))
    assert quiet.filter(record("GET", "/health?x=1", 503))
    assert quiet.filter(record("POST", "/v1/chat/completions", 503))
    assert quiet.filter(record("GET", "/v1/models", 503))
    assert quiet.filter(logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, "plain",
                                          None, None))
