"""Errors of the HTTP layer and their wire shapes in each API.

Every failure is raised as :class:`APIError` and rendered in the shape of the API the path belongs
to: OpenAI ``{"error": {"message", "type", "param", "code"}}`` (platform.openai.com error codes)
or Anthropic ``{"type": "error", "error": {"type", "message"}}`` (docs.anthropic.com "Errors").

A 503 (the model is loading, the engine is down, the server is stopping) goes out as 503
``server_error`` on OpenAI paths and as Anthropic's own overloaded status, 529
``overloaded_error``, on Anthropic paths (:func:`wire_status`): Anthropic's API has no 503, and its
clients (Claude Code) treat 529 as "retry later".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import ValidationError
from starlette.responses import JSONResponse

Api = Literal["openai", "anthropic"]

# Anthropic error type per HTTP status (docs.anthropic.com/en/api/errors).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
ANTHROPIC_OVERLOADED = 529
"""The HTTP status of Anthropic's ``overloaded_error``."""
# OpenAI error type per HTTP status.
_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    500: "server_error",
    503: "server_error",
}
# Pydantic union-branch labels that appear in error locations but are not field names.
_BRANCH_LABELS = frozenset({"str", "int", "float", "bool", "none", "dict", "list"})


@dataclass
class APIError(Exception):
    """A request failure with an HTTP status and a human-readable message.

    Attributes:
        status: HTTP status code (400, 401, 404, 413, 500, 503).
        message: what went wrong, naming the offending field when there is one.
        param: the offending request field as a dotted path (``messages.0.role``), or None.
        code: machine-readable OpenAI ``code`` (``context_length_exceeded``,
            ``invalid_api_key``...), or None.
    """

    status: int
    message: str
    param: str | None = None
    code: str | None = None

    def __str__(self) -> str:
        return self.message


def api_for_path(path: str) -> Api:
    """The API whose error shape a path uses: ``/v1/messages*`` is Anthropic, the rest OpenAI."""
    return "anthropic" if path.startswith("/v1/messages") else "openai"


def openai_error_body(err: APIError) -> dict:
    """``{"error": {"message", "type", "param", "code"}}`` for ``err``."""
    kind = _OPENAI_TYPES.get(
        err.status, "invalid_request_error" if err.status < 500 else "server_error"
    )
    return {"error": {"message": err.message, "type": kind, "param": err.param, "code": err.code}}


def anthropic_error_body(err: APIError) -> dict:
    """``{"type": "error", "error": {"type", "message"}}`` for ``err``."""
    kind = _ANTHROPIC_TYPES.get(
        err.status, "invalid_request_error" if err.status < 500 else "api_error"
    )
    return {"type": "error", "error": {"type": kind, "message": err.message}}


def error_body(err: APIError, api: Api) -> dict:
    """The JSON body of ``err`` in ``api``'s shape."""
    return anthropic_error_body(err) if api == "anthropic" else openai_error_body(err)


def wire_status(err: APIError, api: Api) -> int:
    """The HTTP status ``err`` is sent with: its own, except a 503 on an Anthropic path, which is
    Anthropic's overloaded status 529."""
    return ANTHROPIC_OVERLOADED if api == "anthropic" and err.status == 503 else err.status


def error_response(err: APIError, api: Api) -> JSONResponse:
    """A JSON response carrying ``err`` in ``api``'s shape, with :func:`wire_status`."""
    return JSONResponse(error_body(err, api), status_code=wire_status(err, api))


def _is_branch_label(part: str | int) -> bool:
    """True for the union-branch tags pydantic puts in error locations (``str``,
    ``list[dict[str,any]]``, ``function-after[...]``, a model class name such as
    ``NamedToolChoice``); request field names are snake_case, so they never match."""
    if not isinstance(part, str):
        return False
    return (
        part in _BRANCH_LABELS
        or "[" in part
        or part.startswith("function-")
        or part[:1].isupper()
    )


def field_path(loc: tuple[str | int, ...]) -> str:
    """Dotted field path of a pydantic error location, without union-branch labels.

    ``("messages", 0, "content", "str")`` → ``"messages.0.content"``.
    """
    return ".".join(str(p) for p in loc if not _is_branch_label(p))


def from_validation_error(exc: ValidationError, prefix: str = "") -> APIError:
    """A 400 naming the most specific invalid field of ``exc`` (optionally under ``prefix``).

    When a value fails every branch of a union, pydantic reports one error per branch; the
    error located deepest (most path parts once branch labels are dropped) is the one that says
    what is actually wrong (``messages.0.content.0: Input should be a valid dictionary`` rather
    than ``messages.0.content: Input should be a valid string``). Ties keep pydantic's order.

    Example message: ``"messages.0.role: Input should be 'system', 'user' or 'assistant'"``.
    """
    errors = exc.errors(include_url=False)
    first = max(errors, key=lambda e: len(field_path(tuple(e["loc"])).split(".")))
    path = field_path(tuple(first["loc"]))
    path = ".".join(p for p in (prefix, path) if p)
    message = first["msg"]
    if first["type"] == "missing":
        message = "Field required"
    elif first["type"] == "value_error" and "error" in first.get("ctx", {}):
        message = str(first["ctx"]["error"])  # a validator's own words, without "Value error, "
    return APIError(400, f"{path}: {message}" if path else message, param=path or None)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    """A 400 :class:`APIError`."""
    return APIError(400, message, param=param, code=code)
