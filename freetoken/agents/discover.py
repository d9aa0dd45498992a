"""Which model a server serves, and its token limits: ``GET {server}/v1/models``.

FreeToken's model card (``freetoken/server/openai_routes.py``) carries ``max_model_len`` (context
length in tokens), ``max_input_tokens`` (``max_model_len - 1``) and ``max_tokens`` (the server's cap
on generated tokens per request). Other OpenAI-compatible servers use other names for the context
length (vLLM: ``max_model_len``; OpenRouter-style lists: ``context_length``); every name below is
read, first match wins. A limit the card does not state stays None (``target`` picks a default).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

CONTEXT_KEYS = ("max_model_len", "context_length", "context_window", "max_context_length",
                "max_input_tokens")
OUTPUT_KEYS = ("max_tokens", "max_output_tokens", "max_completion_tokens")
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0


class DiscoveryError(Exception):
    """The server cannot be reached or its model list is unusable; the message is one line."""


@dataclass(frozen=True)
class ServedModel:
    """One model a server lists.

    ``server`` is the base URL (no trailing slash, no ``/v1``); ``context_window`` and
    ``max_output_tokens`` are token counts, None when the card does not state them.
    """

    server: str
    name: str
    context_window: int | None
    max_output_tokens: int | None


def _limit(card: dict, keys: tuple[str, ...], where: str) -> int | None:
    """The first of ``keys`` present in ``card`` as a positive int (None when none is present).

    Raises:
        DiscoveryError: a present key holds anything but a positive integer.
    """
    for key in keys:
        if key in card and card[key] is not None:
            value = card[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DiscoveryError(f"{where}: model {card['id']!r} has an invalid {key} ({value!r}); "
                                     "expected a positive integer")
            return value
    return None


def parse_model_list(body: object, server: str, model: str | None = None) -> ServedModel:
    """The model to use from a parsed ``/v1/models`` answer (OpenAI list shape).

    Args:
        body: the decoded JSON answer; must be ``{"data": [{"id": str, ...}, ...]}``.
        server: the base URL the answer came from (used in messages and the result).
        model: the model to pick (``--model``); None picks the only listed one.

    Raises:
        DiscoveryError: not a model list, a card without a string ``id``, no model listed, several
            listed and ``model`` is None, ``model`` not listed, or an invalid limit.
    """
    where = f"{server}/v1/models"
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        raise DiscoveryError(f"{where} did not answer a model list (a JSON object with a \"data\" array)")
    cards = body["data"]
    if not all(isinstance(c, dict) and isinstance(c.get("id"), str) and c["id"] for c in cards):
        raise DiscoveryError(f"{where} listed a model without a string \"id\"")
    if not cards:
        raise DiscoveryError(f"{where} lists no model")
    names = [c["id"] for c in cards]
    if model is None:
        if len(cards) > 1:
            raise DiscoveryError(f"{where} lists several models ({', '.join(names)}); pick one with --model")
        card = cards[0]
    elif model in names:
        card = cards[names.index(model)]
    else:
        raise DiscoveryError(f"model {model!r} is not served by {server} (it serves: {', '.join(names)})")
    return ServedModel(server, card["id"], _limit(card, CONTEXT_KEYS, where), _limit(card, OUTPUT_KEYS, where))


def is_loopback(url: str) -> bool:
    """Whether ``url``'s host is ``localhost`` or a loopback address (127.0.0.0/8, ::1)."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _error_text(response) -> str:  # noqa: ANN001 - an httpx.Response
    """The server's error message (OpenAI or Anthropic shape), else the start of the body."""
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return " ".join(response.text.split())[:200] or response.reason_phrase


def discover(server: str, model: str | None = None, api_key: str | None = None) -> ServedModel:
    """``GET {server}/v1/models`` and pick the model to launch against (see ``parse_model_list``).

    ``api_key`` goes as a Bearer token. Proxy variables are ignored for a loopback server (a
    corporate ``HTTP_PROXY`` cannot reach the user's own 127.0.0.1).

    Raises:
        DiscoveryError: the server cannot be reached, answers an HTTP error or non-JSON, or the
            list is unusable (``parse_model_list``).
    """
    import httpx

    url = f"{server}/v1/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
    try:
        response = httpx.get(url, headers=headers, timeout=timeout, trust_env=not is_loopback(server))
    except (httpx.TransportError, httpx.InvalidURL) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise DiscoveryError(f"cannot reach the server at {server} ({reason}); is `freetoken serve` "
                             "running there?") from None
    if response.status_code >= 400:
        hint = " (pass --api-key or set FREETOKEN_API_KEY)" if response.status_code in (401, 403) else ""
        raise DiscoveryError(f"{url} answered HTTP {response.status_code}: {_error_text(response)}{hint}")
    try:
        body = response.json()
    except ValueError:
        snippet = " ".join(response.text.split())[:80]
        raise DiscoveryError(f"{url} did not answer JSON (got {snippet!r})") from None
    return parse_model_list(body, server, model)
