"""Wait for a server that is still loading its model, before ``freetoken launch`` discovers it.

``freetoken serve`` answers from its first second: while the model loads, ``GET /health`` is 503
``{"status": "loading", "progress": {"stage", "elapsed_s", "done_bytes", "total_bytes",
"fraction"}}``, and ``{"status": "failed", "error": ...}`` once the load failed (the server then
exits). :func:`wait_until_loaded` polls it while it says ``loading``; any other answer (200, a
server without ``/health``, an error status) ends the wait and discovery reports what it finds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from freetoken.agents.discover import CONNECT_TIMEOUT_S, DiscoveryError, is_loopback
from freetoken.units import format_bytes

DEFAULT_WAIT_S = 600.0
POLL_INTERVAL_S = 1.0


@dataclass(frozen=True)
class Health:
    """One ``GET /health`` answer: the HTTP status and the JSON body (None when not JSON)."""

    status: int
    body: object


def get_health(server: str) -> Health | None:
    """``GET {server}/health`` (no API key: the route needs none); None when unreachable."""
    import httpx

    try:
        response = httpx.get(f"{server}/health", timeout=httpx.Timeout(CONNECT_TIMEOUT_S),
                             trust_env=not is_loopback(server))
    except (httpx.TransportError, httpx.InvalidURL):
        return None
    try:
        body = response.json()
    except (ValueError, json.JSONDecodeError):
        body = None
    return Health(response.status_code, body)


def loading_progress(health: Health | None) -> dict | None:
    """The ``progress`` object of a "still loading" answer, else None."""
    body = health.body if health is not None else None
    if health is None or health.status != 503 or not isinstance(body, dict):
        return None
    if body.get("status") != "loading":
        return None
    progress = body.get("progress")
    return progress if isinstance(progress, dict) else {}


def describe_progress(progress: dict) -> str:
    """``weights 42% (10.00 MiB of 23.00 MiB), 12 s``: the stage, the bytes when known, the time."""
    text = str(progress.get("stage") or "starting")
    done, total = progress.get("done_bytes"), progress.get("total_bytes")
    if isinstance(done, int) and isinstance(total, int) and total > 0:
        text += f" {done / total:.0%} ({format_bytes(done)} of {format_bytes(total)})"
    elapsed = progress.get("elapsed_s")
    if isinstance(elapsed, (int, float)):
        text += f", {elapsed:.0f} s"
    return text


def wait_until_loaded(server: str, timeout_s: float = DEFAULT_WAIT_S, *,
                      show: Callable[[str, bool], None] | None = None,
                      fetch: Callable[[str], Health | None] = get_health,
                      sleep: Callable[[float], None] = time.sleep,
                      clock: Callable[[], float] = time.monotonic) -> None:
    """Return once ``server`` is no longer loading its model.

    Args:
        server: base URL (no ``/v1``).
        timeout_s: how long to wait for a load.
        show: called with a progress line and whether it is the last one, on each poll while
            loading, then with ``"loaded"`` or (before the error is raised) ``"failed"`` and True
            (None: silent).
        fetch, sleep, clock: the ``/health`` call and the time source (tests replace them).

    Raises:
        DiscoveryError: the load failed (the server's error), the server stopped answering
            while it loaded, or it still loads after ``timeout_s``.
    """
    deadline = clock() + timeout_s
    seen_loading = False
    while True:
        health = fetch(server)
        progress = loading_progress(health)
        if progress is None:
            try:
                _check_answer(server, health, seen_loading)
            except DiscoveryError:
                if seen_loading and show is not None:
                    show("failed", True)
                raise
            if seen_loading and show is not None:
                show("loaded", True)
            return
        seen_loading = True
        line = describe_progress(progress)
        if show is not None:
            show(line, False)
        if clock() >= deadline:
            raise DiscoveryError(f"the server at {server} is still loading its model after "
                                 f"{timeout_s:.0f} s ({line}); wait longer with --wait SECONDS")
        sleep(POLL_INTERVAL_S)


def _check_answer(server: str, health: Health | None, seen_loading: bool) -> None:
    """Raise for a failed load, or a server that went away while it loaded."""
    body = health.body if health is not None else None
    if isinstance(body, dict) and body.get("status") == "failed":
        raise DiscoveryError(f"the server at {server} failed to load its model: "
                             f"{body.get('error')}")
    if health is None and seen_loading:
        raise DiscoveryError(f"the server at {server} stopped answering while it loaded its "
                             "model; see its log")
