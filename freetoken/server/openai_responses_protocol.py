"""Request body of ``POST /v1/responses`` and its input items (OpenAI Responses API).

Field names and meanings follow the OpenAI API reference ("Responses"). Unknown fields
(``include``, ``truncation``, ``service_tier``, ``prompt_cache_key``, ``background``...) are
accepted and ignored. ``input`` items are validated one by one when the conversation is built
(:mod:`freetoken.server.openai_responses_input`), so an error names the item's path
(``input.2.call_id``). Extensions shared with the chat endpoint: ``top_k``, ``seed``,
``ignore_eos``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from freetoken.server.openai_protocol import ReasoningEffort


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class FunctionTool(_Lenient):
    """``tools[]``: a function tool (``strict`` is echoed; forced calls are always
    grammar-constrained to the schema, see :mod:`freetoken.server.tools`)."""

    type: Literal["function"]
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionChoice(_Lenient):
    """``tool_choice: {"type": "function", "name": ...}``: exactly one call of that tool."""

    type: Literal["function"]
    name: str


class ReasoningConfig(_Lenient):
    """``reasoning``: ``effort`` (``none`` turns thinking off, any other level on); ``summary``
    is echoed (the model's reasoning is reported as it is, not summarised)."""

    effort: ReasoningEffort | None = None
    summary: str | None = None


class TextConfig(_Lenient):
    """``text``: ``format`` is ``text``, ``json_object`` or ``json_schema`` (validated and served
    by :mod:`freetoken.server.structured`); ``verbosity`` is ignored."""

    format: dict[str, Any] | None = None
    verbosity: str | None = None


class ResponsesRequest(_Lenient):
    """``POST /v1/responses`` body.

    ``tools`` stays raw here: :mod:`freetoken.server.openai_responses_tools` sorts the
    declared types (function, custom, hosted tools that are dropped).

    ``input`` is a string (one user message) or a list of items (see module docstring); it may
    be omitted only when ``previous_response_id`` continues a stored conversation.
    """

    model: str | None = None
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: Literal["auto", "none", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    seed: int | None = None
    ignore_eos: bool = False
    stream: bool = False
    reasoning: ReasoningConfig | None = None
    text: TextConfig | None = None
    store: bool = True
    metadata: dict[str, str] | None = None
    user: str | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None


class InputMessage(_Lenient):
    """A ``message`` item: ``content`` is a string or parts (``input_text`` / ``output_text``
    / ``text``, ``refusal``); ``developer`` is treated as ``system``."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[dict[str, Any]]


class FunctionCallItem(_Lenient):
    """A ``function_call`` item: a call the model made earlier (``arguments``: JSON text)."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str = "{}"


class FunctionCallOutputItem(_Lenient):
    """A ``function_call_output`` item: the result of the call ``call_id`` (text or parts)."""

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[dict[str, Any]]


class ReasoningItem(_Lenient):
    """A ``reasoning`` item: earlier reasoning, from ``content`` (``reasoning_text`` parts) or
    else ``summary`` (``summary_text`` parts); ``encrypted_content`` is opaque and ignored."""

    type: Literal["reasoning"]
    summary: list[dict[str, Any]] = []
    content: list[dict[str, Any]] | None = None


class CustomToolCallItem(_Lenient):
    """A ``custom_tool_call`` item: an earlier call of a custom tool (``input``: its raw text)."""

    type: Literal["custom_tool_call"]
    call_id: str
    name: str
    input: str = ""


class CustomToolCallOutputItem(_Lenient):
    """A ``custom_tool_call_output`` item: the result of the custom call ``call_id``."""

    type: Literal["custom_tool_call_output"]
    call_id: str
    output: str | list[dict[str, Any]]


class LocalShellCallItem(_Lenient):
    """A ``local_shell_call`` item: a shell command the model ran through the hosted
    ``local_shell`` tool; its result comes back as a ``function_call_output``."""

    type: Literal["local_shell_call"]
    call_id: str
    action: dict[str, Any] = {}
