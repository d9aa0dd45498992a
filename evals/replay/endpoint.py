"""The endpoint checks shared by ``evals/run.py`` and ``evals/run_swe.py``: URL normalisation, the
API key from the environment, and one ``GET /v1/models`` made before any request is replayed, so
that a wrong URL, a server that is down, a key that is missing or a server that does not speak the
OpenAI API stops the run at once with one clear line (exit 2 in both commands).

``GET /v1/models`` is the OpenAI model list (FreeToken, vLLM, llama.cpp's servers and Anthropic's
API all serve it); FreeToken requires the key there when started with ``--api-key``
(``freetoken/server/middleware.py``), so a 401 here means every replayed request would fail too.

:func:`fetch_server_moe` reads FreeToken's ``GET /v1/freetoken/memory`` (the MoE backend, eviction
policy, device and expert cache, ``freetoken/server/admin_routes.py``) so that a run records the
server settings it measured; other servers answer 404 and the run records none.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import httpx

from freetoken.agents.discover import is_loopback

API_KEY_ENV = "FREETOKEN_API_KEY"
PROBE_TIMEOUT_S = 30.0
PROBE_CONNECT_TIMEOUT_S = 5.0


class EndpointError(ValueError):
    """The endpoint is unusable: unreachable, wants a key, or no OpenAI model list. One line."""


def normalize_endpoint(url: str) -> str:
    """The base URL without trailing slashes and without a trailing ``/v1`` (the commands add
    ``/v1/...`` themselves; ``http://h:8000/v1/`` becomes ``http://h:8000``).

    Raises:
        EndpointError: not an ``http://`` or ``https://`` URL with a host.
    """
    base = url.strip().rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3].rstrip("/")
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EndpointError(f"--endpoint {url!r} is not an http:// or https:// URL with a host "
                            "(e.g. http://127.0.0.1:8000)")
    return base


def api_key_or_env(api_key: str | None) -> str | None:
    """``api_key`` when given, else ``$FREETOKEN_API_KEY`` when set and non-empty, else None."""
    return api_key or os.environ.get(API_KEY_ENV) or None


def _error_text(resp: httpx.Response) -> str:
    """The server's error message (OpenAI / Anthropic error shape), else the body's start."""
    try:
        err = resp.json()["error"]
        return str(err["message"] if isinstance(err, dict) else err)
    except (ValueError, KeyError, TypeError):
        return " ".join(resp.text.split())[:200] or resp.reason_phrase


def fetch_model_list(endpoint: str, api_key: str | None,
                     timeout_s: float = PROBE_TIMEOUT_S) -> dict:
    """``GET {endpoint}/v1/models`` with the key as ``Authorization: Bearer`` and ``x-api-key``;
    returns the decoded JSON object (``{"data": [{"id": ...}, ...]}``).

    Proxy variables are ignored for a loopback endpoint (as ``freetoken launch`` does).

    Raises:
        EndpointError: connection refused / DNS / timeout (``cannot reach ...``), HTTP 401 or 403
            (``... wants an API key: pass --api-key or set FREETOKEN_API_KEY``), any other status
            but 200 (the status and the server's message: not an OpenAI-compatible server), a
            body that is not a JSON object with a ``data`` list.
    """
    url = f"{endpoint}/v1/models"
    hdrs = {"authorization": f"Bearer {api_key}", "x-api-key": api_key} if api_key else {}
    timeout = httpx.Timeout(timeout_s, connect=PROBE_CONNECT_TIMEOUT_S)
    try:
        resp = httpx.get(url, headers=hdrs, timeout=timeout, trust_env=not is_loopback(endpoint))
    except (httpx.TransportError, httpx.InvalidURL) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise EndpointError(f"cannot reach {endpoint} ({reason}); is the server running there?"
                            ) from None
    if resp.status_code in (401, 403):
        given = " (the key given was refused)" if api_key else ""
        raise EndpointError(f"{url} answered HTTP {resp.status_code}: {_error_text(resp)}; the "
                            "endpoint wants an API key: pass --api-key or set "
                            f"{API_KEY_ENV}{given}")
    if resp.status_code != 200:
        raise EndpointError(f"{url} answered HTTP {resp.status_code}: {_error_text(resp)}; "
                            "not an OpenAI-compatible server (it needs GET /v1/models)")
    try:
        body = resp.json()
    except ValueError:
        snippet = " ".join(resp.text.split())[:80]
        raise EndpointError(f"{url} did not answer JSON (got {snippet!r}); not an "
                            "OpenAI-compatible server") from None
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        raise EndpointError(f"{url} did not answer a model list (a JSON object with a \"data\" "
                            "array); not an OpenAI-compatible server")
    return body


def first_model_id(body: dict) -> str | None:
    """The first ``id`` of a model list (``fetch_model_list``), None when it lists none."""
    for card in body.get("data") or []:
        if isinstance(card, dict) and isinstance(card.get("id"), str) and card["id"]:
            return card["id"]
    return None


def fetch_server_moe(endpoint: str, api_key: str | None,
                     timeout_s: float = PROBE_TIMEOUT_S) -> dict | None:
    """The JSON object of ``GET {endpoint}/v1/freetoken/memory`` (FreeToken's MoE settings:
    ``backend``, ``policy``, ``device``, ``expert_cache``, ...; stored whole), or None when the
    endpoint does not answer 200 with a JSON object (not FreeToken, an older FreeToken, a
    transport error). Never raises for HTTP or transport errors."""
    hdrs = {"authorization": f"Bearer {api_key}", "x-api-key": api_key} if api_key else {}
    timeout = httpx.Timeout(timeout_s, connect=PROBE_CONNECT_TIMEOUT_S)
    try:
        resp = httpx.get(f"{endpoint}/v1/freetoken/memory", headers=hdrs, timeout=timeout,
                         trust_env=not is_loopback(endpoint))
        body = resp.json() if resp.status_code == 200 else None
    except (httpx.HTTPError, httpx.InvalidURL, ValueError):
        return None
    return body if isinstance(body, dict) else None
