"""Per-app state shared by the routes: the engine, settings, chat template and parser factory."""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from freetoken.core import GenerationOutput, GenerationRequest, SamplingParams
from freetoken.engine.client import EngineClient
from freetoken.server.config import ServerConfig
from freetoken.parsers.events import ParserEvent
from freetoken.server.generation import Admitted, Finish, chat_events
from freetoken.server.errors import Api, APIError, bad_request, from_validation_error
from freetoken.server.prompt import (
    OutputParserLike,
    ParserFactory,
    Prompt,
    PromptTemplate,
    check_context,
    render_prompt,
)
from freetoken.server.tools import ToolPolicy

if TYPE_CHECKING:
    from freetoken.server.sessions import HarnessBinding, SessionStore


@dataclass(frozen=True)
class ChatJob:
    """One chat request, ready for the engine.

    Attributes:
        request_id: the response id (``chatcmpl-…`` / ``msg_…``), also the engine request id.
        model: the model name the client asked for (echoed back in responses).
        created: unix time (s) the request was accepted.
        prompt: the rendered and tokenized prompt.
        sampling: clamped sampling parameters.
        policy: tools and whether to parse tool calls.
        binding: the harness adapter, session and anchor policy serving it (None: server
            defaults, nothing recorded).
    """

    request_id: str
    model: str
    created: int
    prompt: Prompt
    sampling: SamplingParams
    policy: ToolPolicy
    binding: HarnessBinding | None = None

    def engine_request(self, report_admission: bool = False) -> GenerationRequest:
        """The :class:`GenerationRequest` handed to the engine (with the session's anchors)."""
        anchors = self.binding.anchors if self.binding is not None else None
        return GenerationRequest(self.request_id, self.prompt.token_ids, self.sampling, anchors,
                                 report_admission)


@dataclass(frozen=True)
class ServerContext:
    """Everything a route needs; built once by ``create_app``."""

    engine: EngineClient
    config: ServerConfig
    template: PromptTemplate
    parser_factory: ParserFactory
    sessions: SessionStore

    def model_name(self, requested: str | None) -> str:
        """The name to echo: the requested one, else the served name."""
        return requested or self.config.served_model_name

    def check_healthy(self) -> None:
        """Raises APIError 503 when the engine loop is not alive."""
        if not self.engine.is_healthy():
            raise APIError(503, "the engine is not healthy; try again later")

    def render(
        self, messages: list[dict], policy: ToolPolicy, enable_thinking: bool | None,
        reasoning_effort: str | None = None,
    ) -> Prompt:
        """Render and tokenize a conversation (400 on template errors); ``reasoning_effort``
        reaches the template only when set (see ``render_prompt``)."""
        return render_prompt(
            self.template, self.engine.tokenizer, messages, policy.tools, enable_thinking,
            reasoning_effort,
        )

    def record(self, binding: HarnessBinding | None, prompt_ids: tuple[int, ...],
               out: GenerationOutput) -> None:
        """Add a finished request (its last output chunk) to its session's totals."""
        if binding is not None and out.finish_reason in ("stop", "length"):
            self.sessions.record(binding.session, prompt_ids, out.prompt_tokens,
                                 out.cached_tokens, out.completion_tokens)

    def check_context(self, prompt_len: int, api: Api, param: str) -> None:
        """400 when ``prompt_len + 1 > engine.info.max_model_len``."""
        check_context(prompt_len, self.engine.info.max_model_len, api, param)

    def events(self, job: ChatJob, report_admission: bool = False
               ) -> AsyncIterator[ParserEvent | Admitted | Finish]:
        """``chat_events`` of ``job`` with a fresh parser; the finish goes to its session.
        ``report_admission``: an :class:`Admitted` comes first when the engine sends one."""
        request = job.engine_request(report_admission)
        return chat_events(self.engine, request, self.new_parser(job),
                           lambda out: self.record(job.binding, request.prompt_ids, out))

    def new_parser(self, job: ChatJob) -> OutputParserLike:
        """A fresh output parser for ``job`` (inside reasoning when the prompt opened it)."""
        return self.parser_factory(
            job.policy.tools,
            in_reasoning=job.prompt.in_reasoning,
            parse_tools=job.policy.parse_tools,
        )


def now() -> int:
    """Current unix time in whole seconds."""
    return int(time.time())


async def parse_body(request: Request, model: type[BaseModel]) -> Any:
    """``read_body(request, model)[0]``: the validated body (see :func:`read_body`)."""
    return (await read_body(request, model))[0]


async def read_body(request: Request, model: type[BaseModel]) -> tuple[Any, dict]:
    """Read the request body as JSON and validate it against ``model``; returns the validated
    object and the parsed JSON object it came from (for harness detection).

    Strict JSON (RFC 8259): the ``NaN`` / ``Infinity`` literals Python's parser would accept are
    refused, and so are strings holding a lone UTF-16 surrogate escape (``"\\ud800"``), which no
    UTF-8 tokenizer or response encoder can carry.

    Raises:
        APIError: 400 for malformed JSON (including nesting too deep to parse), a non-object
            body, a lone surrogate (the message names the field), or a schema violation (the
            message names the most specific offending field).
    """
    raw = await request.body()
    data = load_json(raw)
    if not isinstance(data, dict):
        raise bad_request("request body must be a JSON object")
    if _SURROGATE_ESCAPE.search(raw):
        check_unicode(data)
    try:
        return model.model_validate(data), data
    except ValidationError as exc:
        raise from_validation_error(exc) from None


# A ``\uD800``-``\uDFFF`` escape; only bodies containing one need the (slower) surrogate walk.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a valid JSON value")


def load_json(raw: bytes) -> Any:
    """Parse a request body as strict JSON.

    Raises:
        APIError: 400 ``request body is not valid JSON: ...`` for syntax errors, invalid UTF-8,
            ``NaN``/``Infinity``/``-Infinity`` literals, or nesting too deep to parse.
    """
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise bad_request(
            "request body is not valid JSON: arrays/objects are nested too deeply"
        ) from None


def check_unicode(data: Any) -> None:
    """Reject the first string (value or key) of a parsed body that holds a lone surrogate.

    Walks the structure iteratively (no recursion limit), in document order. A bad key is
    named with its surrogate written as a ``\\udXXX`` escape, so the error itself can be encoded.

    Raises:
        APIError: 400 ``<field path>: string contains a lone UTF-16 surrogate (\\udXXX), which is
            not valid Unicode`` with ``param`` set to the path.
    """
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            bad = _lone_surrogate(value)
            if bad is not None:
                raise bad_request(
                    f"{path or 'body'}: string contains a lone UTF-16 surrogate "
                    f"(\\u{ord(bad):04x}), which is not valid Unicode",
                    param=path or None,
                )
        elif isinstance(value, dict):
            items = list(value.items())
            for key, item in reversed(items):
                name = key.encode("utf-8", "backslashreplace").decode("utf-8")
                child = f"{path}.{name}" if path else name
                stack.append((child, item))
                stack.append((child, key))
        elif isinstance(value, list):
            for i in range(len(value) - 1, -1, -1):
                stack.append((f"{path}.{i}" if path else str(i), value[i]))


def _lone_surrogate(text: str) -> str | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return text[exc.start]
    return None
