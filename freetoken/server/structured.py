"""Structured outputs: the JSON-answer formats of the three APIs, reduced to one schema and
turned into the decoding constraint (:class:`freetoken.constrain.JsonAnswerGrammar`).

Accepted shapes (anything else is a 400 naming the field):

* chat ``response_format``: ``{"type": "text"}`` (no constraint), ``{"type": "json_object"}``
  (any JSON object), ``{"type": "json_schema", "json_schema": {"name", "description",
  "schema", "strict"}}``;
* Responses ``text.format``: ``{"type": "text"}``, ``{"type": "json_object"}``,
  ``{"type": "json_schema", "name", "description", "schema", "strict"}``;
* Messages ``output_config.format`` or, when that is absent, the older top-level
  ``output_format``: ``{"type": "json_schema", "schema"}``.

A chat / Responses ``json_schema`` without ``schema`` means any JSON object (as ``json_object``;
Messages requires ``schema``), while ``"schema": {}`` allows any JSON value. ``strict`` is
accepted either way: the answer always follows the schema, with undeclared keys refused where
``properties`` are listed (see :mod:`freetoken.constrain.answer`). The schema must be a JSON
object that llguidance can compile; keywords it does not implement are ignored. ``name`` and
``description`` are not checked (the Responses API echoes the format as sent).

With tools: a forced call (``required`` / named / ``any`` / ``tool``) wins, its grammar is the
constraint and the format is only validated; with ``auto`` the model may either call tools (the
forced-call grammar's calls) or answer in the schema; with ``none`` it answers in the schema.
Reasoning stays free in every case (the think block the prompt opened, or a harmony analysis
message, comes first). A JSON answer cut by ``max_tokens`` is returned as it is (partial text,
finish ``length`` / ``max_tokens`` / ``incomplete``), not as an error.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from freetoken.constrain import GrammarError, json_answer_grammar
from freetoken.constrain.matcher import check_answer_grammar
from freetoken.core import SamplingParams
from freetoken.server.errors import bad_request, from_validation_error
from freetoken.server.tools import ToolPolicy, call_form


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class _TypeOnly(_Lenient):
    type: Literal["text", "json_object", "json_schema"]


class JsonSchemaFields(_Lenient):
    """The schema fields of a ``json_schema`` format (chat: under ``json_schema``; Responses:
    at the top; Messages: ``schema`` only)."""

    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class _ChatJsonSchema(_Lenient):
    type: Literal["json_schema"]
    json_schema: JsonSchemaFields


class _AnthropicFormat(_Lenient):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


@dataclass(frozen=True)
class AnswerFormat:
    """A requested JSON answer.

    Attributes:
        schema: its JSON schema, or None for any JSON object (``json_object``).
        param: the request field of the schema (``response_format.json_schema.schema``), named
            in errors.
    """

    schema: dict | None
    param: str


def _parse(model: type[BaseModel], raw: object, prefix: str) -> BaseModel:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise from_validation_error(exc, prefix) from None


def _kind(raw: object, prefix: str) -> str:
    return _parse(_TypeOnly, raw, prefix).type


def chat_format(raw: dict | None) -> AnswerFormat | None:
    """The JSON answer a chat ``response_format`` asks for (None: plain text).

    Raises:
        APIError: 400 for an unknown ``type`` or a ``json_schema`` without a valid
            ``json_schema`` object (``response_format.json_schema.schema: Input should be a
            valid dictionary``).
    """
    if raw is None:
        return None
    kind = _kind(raw, "response_format")
    if kind == "text":
        return None
    if kind == "json_object":
        return AnswerFormat(None, "response_format")
    fields = _parse(_ChatJsonSchema, raw, "response_format").json_schema
    return AnswerFormat(fields.schema_, "response_format.json_schema.schema")


def responses_format(raw: dict | None) -> AnswerFormat | None:
    """The JSON answer a Responses ``text.format`` asks for (None: plain text).

    Raises:
        APIError: 400 as :func:`chat_format` (fields under ``text.format``).
    """
    if raw is None:
        return None
    kind = _kind(raw, "text.format")
    if kind == "text":
        return None
    if kind == "json_object":
        return AnswerFormat(None, "text.format")
    return AnswerFormat(_parse(JsonSchemaFields, raw, "text.format").schema_,
                        "text.format.schema")


def anthropic_format(output_config: object, output_format: object) -> AnswerFormat | None:
    """The JSON answer of a Messages request: ``output_config.format``, else ``output_format``
    (None when neither is given; a non-object ``output_config`` is ignored, as before).

    Raises:
        APIError: 400 for a format whose ``type`` is not ``json_schema`` or whose ``schema`` is
            missing or not an object (``output_config.format.schema: Field required``).
    """
    raw, prefix = None, ""
    if isinstance(output_config, dict) and output_config.get("format") is not None:
        raw, prefix = output_config["format"], "output_config.format"
    elif output_format is not None:
        raw, prefix = output_format, "output_format"
    if raw is None:
        return None
    return AnswerFormat(_parse(_AnthropicFormat, raw, prefix).schema_, f"{prefix}.schema")


def constrain(sampling: SamplingParams, policy: ToolPolicy, fmt: AnswerFormat | None,
              template: object, in_reasoning: bool) -> SamplingParams:
    """``sampling`` with the request's decoding constraint: a forced call's grammar, else the
    JSON answer's (with the tools' calls as the alternative under ``auto``), else none.

    Raises:
        APIError: 400 (param ``fmt.param``) when the schema cannot be compiled into a grammar,
            or (param ``tools``) when a tool schema cannot.
    """
    answer = None
    if fmt is not None:
        try:
            answer = json_answer_grammar(fmt.schema, call_form(template), reasoning=in_reasoning)
            check_answer_grammar(answer)
        except GrammarError as exc:
            raise bad_request(f"{fmt.param}: {exc}", param=fmt.param) from None
    if answer is None or policy.require_call:
        return policy.constrain(sampling, template, in_reasoning)
    if policy.parse_tools and policy.tools:
        answer = replace(answer, calls=policy.call_grammar(template, in_reasoning))
    return replace(sampling, grammar=answer)
