"""Starts ``freetoken serve`` as a real subprocess on a free loopback port (test helper)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """An unused TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def live_server(*args: str, log_path: Path, timeout_s: float = 600.0) -> Iterator[str]:
    """Run ``python -m freetoken serve --port P *args``; yields the base URL once /health is 200.

    The server's stdout+stderr go to ``log_path``. Raises RuntimeError if it exits or does not
    become healthy within ``timeout_s`` seconds (the first run generates the tiny model).
    """
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "freetoken", "serve", "--port", str(port), *args],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()}")
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not healthy after {timeout_s}s:\n{log_path.read_text()}")
            time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
