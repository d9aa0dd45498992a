"""Per-app state shared by the routes: the engine, settings, chat template and parser factory."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from freetoken.core import GenerationRequest, SamplingParams
from freetoken.engine.client import EngineClient
from freetoken.server.config import ServerConfig
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
    """

    request_id: str
    model: str
    created: int
    prompt: Prompt
    sampling: SamplingParams
    policy: ToolPolicy

    def engine_request(self) -> GenerationRequest:
        """The :class:`GenerationRequest` handed to the engine."""
        return GenerationRequest(self.request_id, self.prompt.token_ids, self.sampling)


@dataclass(frozen=True)
class ServerContext:
    """Everything a route needs; built once by ``create_app``."""

    engine: EngineClient
    config: ServerConfig
    template: PromptTemplate
    parser_factory: ParserFactory

    def model_name(self, requested: str | None) -> str:
        """The name to echo: the requested one, else the served name."""
        return requested or self.config.served_model_name

    def check_healthy(self) -> None:
        """Raises APIError 503 when the engine loop is not alive."""
        if not self.engine.is_healthy():
            raise APIError(503, "the engine is not healthy; try again later")

    def render(
        self, messages: list[dict], policy: ToolPolicy, enable_thinking: bool | None
    ) -> Prompt:
        """Render and tokenize a conversation (400 on template errors)."""
        return render_prompt(
            self.template, self.engine.tokenizer, messages, policy.tools, enable_thinking
        )

    def check_context(self, prompt_len: int, api: Api, param: str) -> None:
        """400 when ``prompt_len + 1 > engine.info.max_model_len``."""
        check_context(prompt_len, self.engine.info.max_model_len, api, param)

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
    """Read the request body as JSON and validate it against ``model``.

    Raises:
        APIError: 400 for malformed JSON, a non-object body, or a schema violation (the message
            names the first offending field).
    """
    raw = await request.body()
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise bad_request("request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc) from None
