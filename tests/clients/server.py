"""``freetoken serve`` as a subprocess on a free loopback port, for the real-client tests."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]  # ``-m freetoken`` works without an installed package
# uvicorn's access line: 127.0.0.1:PORT - "POST /v1/messages?beta=true HTTP/1.1" 200 OK
ACCESS_LINE = re.compile(r'"(?P<method>[A-Z]+) (?P<target>\S+) HTTP/1\.[01]" (?P<status>\d{3})')
# the engine's line per finished request: request <id> finished (<reason>): prompt N tokens, generated M
FINISHED_LINE = re.compile(r"request (?P<id>\S+) finished \((?P<reason>[^)]*)\): prompt (?P<prompt>\d+) tokens "
                           r"\(reused (?P<reused>\d+), recomputed (?P<recomputed>\d+)\), "
                           r"generated (?P<generated>\d+) tokens")
SERVER_FAULTS = re.compile(r"Traceback \(most recent call last\)|Exception in ASGI application| ERROR |"
                           r"^ERROR:", re.MULTILINE)


def free_port(candidates: range | None = None) -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago: the first free one of ``candidates``,
    else of ``$FREETOKEN_TEST_PORTS`` (``LOW-HIGH``, on a machine whose users share out port
    ranges), else any (the kernel's pick).

    Raises:
        RuntimeError: no port of the range is free.
    """
    if candidates is None:
        low, _, high = os.environ.get("FREETOKEN_TEST_PORTS", "0-0").partition("-")
        candidates = range(int(low), int(high or low) + 1)
    for port in candidates:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return sock.getsockname()[1]
    raise RuntimeError(f"no free port in {candidates}")


@dataclass
class ServerProcess:
    """A running ``freetoken serve``; its stdout and stderr go to ``log_path``.

    ``served_model_name`` is the name passed with ``--served-model-name`` (clients are configured
    with it); ``max_output_tokens`` the ``--max-output-tokens`` cap.
    """

    proc: subprocess.Popen
    port: int
    log_path: Path
    served_model_name: str
    max_output_tokens: int

    @classmethod
    def start(cls, log_path: Path, *, served_model_name: str = "freetoken-tiny", max_output_tokens: int = 48,
              timeout: float = 600.0, extra_args: tuple[str, ...] = (),
              port: int | None = None) -> "ServerProcess":
        """Start ``python -m freetoken serve`` (this interpreter, repo root as cwd) with the default
        (embedded tiny) model and wait until ``GET /health`` is 200.

        ``timeout`` (seconds) covers generating the tiny checkpoint on first use; ``port`` None
        takes a free one (:func:`free_port`).

        Raises:
            RuntimeError: the process exited or did not become healthy in time (log tail included).
        """
        port = free_port() if port is None else port
        cmd = [sys.executable, "-m", "freetoken", "serve", "--port", str(port),
               "--served-model-name", served_model_name, "--max-output-tokens", str(max_output_tokens),
               *extra_args]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        log = open(log_path, "wb")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT,
                                start_new_session=True)
        log.close()
        server = cls(proc, port, log_path, served_model_name, max_output_tokens)
        server._wait_healthy(timeout)
        return server

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>`` (no trailing slash, no ``/v1``)."""
        return f"http://127.0.0.1:{self.port}"

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"freetoken serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.base_url}/health", timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"freetoken serve not healthy after {timeout:.0f}s:\n{self.log_tail()}")

    def log_size(self) -> int:
        """Current size of the log in bytes (an offset for ``log_since``)."""
        return self.log_path.stat().st_size

    def log_since(self, offset: int) -> str:
        """The log text written after byte ``offset``."""
        with open(self.log_path, "rb") as handle:
            handle.seek(offset)
            return handle.read().decode("utf-8", "replace")

    def log_tail(self, chars: int = 4000) -> str:
        """The last ``chars`` characters of the log."""
        return self.log_path.read_text("utf-8", "replace")[-chars:]

    def stop(self, grace: float = 15.0) -> int | None:
        """SIGINT (uvicorn's graceful shutdown), then SIGKILL after ``grace`` seconds; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode
