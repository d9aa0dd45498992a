"""``freetoken ctl``: inspect and control a running server over HTTP.

* ``freetoken ctl memory``: print the expert cache (``GET /v1/freetoken/memory``).
* ``freetoken ctl memory --expert-cache 2GiB``: resize it now (``POST /v1/freetoken/memory``).
* ``freetoken ctl metrics``: print the Prometheus page (``GET /metrics``).

The server is ``--server`` or ``$FREETOKEN_URL`` (default ``http://127.0.0.1:8000``); the key is
``--api-key`` or ``$FREETOKEN_API_KEY``. Failures print one ``freetoken ctl: error: ...`` line on
stderr and exit with status 1.
"""

from __future__ import annotations

import argparse
import os
import sys

from freetoken.units import format_bytes

DEFAULT_URL = "http://127.0.0.1:8000"
TIMEOUT_S = 600.0  # a resize copies experts into the cache: allow minutes
CONNECT_TIMEOUT_S = 5.0


class CtlError(Exception):
    """A failure reported as one line (server unreachable, HTTP error, unexpected answer)."""


def server_url(flag: str | None) -> str:
    """The server base URL: ``flag``, else ``$FREETOKEN_URL``, else ``DEFAULT_URL``, without a
    trailing slash or an OpenAI-style ``/v1`` suffix; ``host:port`` without a scheme means
    ``http://host:port``."""
    url = (flag or os.environ.get("FREETOKEN_URL") or DEFAULT_URL).strip().rstrip("/")
    url = url.removesuffix("/v1").rstrip("/")
    return url if "://" in url else f"http://{url}"


def _error_message(response) -> str:
    """The server's error message (OpenAI or Anthropic shape), else the body's start."""
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text.strip()[:200] or response.reason_phrase


def request(method: str, url: str, path: str, api_key: str | None, body: dict | None = None):
    """``method url+path`` with the key as a Bearer token; the ``httpx.Response`` on 2xx.

    Raises:
        CtlError: the server cannot be reached (``cannot reach the server at URL (reason)``)
            or answered an HTTP error (``server answered STATUS: message``).
    """
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = httpx.Timeout(TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
    try:
        response = httpx.request(method, url + path, headers=headers, json=body, timeout=timeout)
    except (httpx.TransportError, httpx.InvalidURL) as exc:
        raise CtlError(f"cannot reach the server at {url} ({exc or type(exc).__name__})") from None
    if response.status_code >= 400:
        raise CtlError(f"server answered {response.status_code}: {_error_message(response)}")
    return response


def describe_memory(body: dict) -> list[str]:
    """Human-readable lines for a ``GET /v1/freetoken/memory`` answer.

    Raises:
        KeyError, TypeError: the answer lacks the documented fields.
    """
    cache = body["expert_cache"]
    if cache is None:
        return [f"backend: {body['backend']} (no expert cache: every expert stays on the device)"]
    pinned = "pinned" if cache["banks_pinned"] else "pageable"
    lines = [
        f"backend: {body['backend']} (policy {body['policy']}, device {body['device']})",
        f"expert cache: {cache['slots']} slots x {format_bytes(cache['slot_bytes'])} = "
        f"{format_bytes(cache['bytes'])} (of {cache['total_experts']} experts)",
        f"host banks: {format_bytes(cache['bank_bytes'])} ({pinned})",
    ]
    if cache.get("expert_format") is not None:
        lines.append(f"expert format: {cache['expert_format']}, CPU kernel activations "
                     f"{cache.get('cpu_activations', 'fp32')}")
    if cache["pending_resize_bytes"] is not None:
        lines.append(f"pending resize: {format_bytes(cache['pending_resize_bytes'])}")
    if cache.get("memory_floor_bytes") is not None:
        lines.append(f"memory floor: {format_bytes(cache['memory_floor_bytes'])} kept free (the "
                     "cache shrinks when free memory drops below it)")
    return lines


def describe_resize(body: dict) -> str:
    """``expert cache: 96 -> 160 slots (1.50 GiB -> 2.50 GiB), kept 96 experts``.

    Raises:
        KeyError, TypeError: the answer lacks the documented fields.
    """
    c = body["expert_cache"]
    old_bytes = c["old_slots"] * c["slot_bytes"]
    line = (f"expert cache: {c['old_slots']} -> {c['slots']} slots ({format_bytes(old_bytes)} -> "
            f"{format_bytes(c['bytes'])}), kept {c['kept']} experts")
    if c.get("memory_floor_bytes") is not None:
        line += (f"\nnote: a memory floor of {format_bytes(c['memory_floor_bytes'])} is set: the "
                 "watcher shrinks the cache again when free memory is below it at its next check")
    return line


def _json(response) -> dict:
    try:
        body = response.json()
    except ValueError:
        raise CtlError(f"unexpected answer from {response.url}: not JSON") from None
    if not isinstance(body, dict):
        raise CtlError(f"unexpected answer from {response.url}: not a JSON object")
    return body


def _memory(args: argparse.Namespace, url: str, key: str | None) -> list[str]:
    path = "/v1/freetoken/memory"
    if args.expert_cache is None:
        response = request("GET", url, path, key)
        describe = describe_memory
    else:
        response = request("POST", url, path, key, {"expert_cache": args.expert_cache})
        describe = lambda body: [describe_resize(body)]  # noqa: E731
    try:
        return describe(_json(response))
    except (KeyError, TypeError) as exc:
        raise CtlError(f"unexpected answer from {response.url}: missing {exc}") from None


def run_ctl(args: argparse.Namespace) -> int:
    """Run ``freetoken ctl <ctl_command>``; returns the exit status (0, or 1 on failure).

    Args:
        args: parsed flags: ``ctl_command`` (``memory`` or ``metrics``), ``server``,
            ``api_key`` and, for ``memory``, ``expert_cache`` (bytes or None).
    """
    url = server_url(args.server)
    key = args.api_key or os.environ.get("FREETOKEN_API_KEY") or None
    try:
        if args.ctl_command == "memory":
            print("\n".join(_memory(args, url, key)))
        else:
            sys.stdout.write(request("GET", url, "/metrics", key).text)
    except CtlError as exc:
        print(f"freetoken ctl: error: {exc}", file=sys.stderr)
        return 1
    return 0
