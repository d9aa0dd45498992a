"""Request bodies of the OpenAI API (``/v1/chat/completions``, ``/v1/completions``).

Field names and meanings follow the OpenAI API reference (Chat Completions / Completions). Unknown
fields are accepted and ignored; fields FreeToken cannot honour (``n`` > 1, ``best_of`` > 1,
``echo``, image parts) are rejected with a 400 (``logprobs`` on completions is at most 5, as on
OpenAI's API). ``response_format`` is validated and served by
:mod:`freetoken.server.structured`; ``logit_bias`` (token id string → bias in [-100, 100]) is
checked by ``sampling.parse_logit_bias`` and applied by the engine's sampler step.
Extensions shared with vLLM: ``top_k``, ``ignore_eos``, ``chat_template_kwargs``,
``response_format`` on completions.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt


ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
"""The ``reasoning_effort`` levels OpenAI documents, lowest first: the OpenAI SDK's
``openai.types.shared.ReasoningEffort`` (generated from the API's OpenAPI spec; ``none`` turns
reasoning off, ``xhigh`` and ``max`` came with the later GPT-5 models). Any other value is a
400."""


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class FunctionCallIn(_Lenient):
    """``tool_calls[].function`` of an assistant message (``arguments``: usually JSON text)."""

    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(_Lenient):
    """One tool call an assistant message made earlier in the conversation."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessage(_Lenient):
    """One chat message; ``developer`` is treated as ``system``.

    ``content`` is a string, a list of content parts (``{"type": "text", "text": ...}``) or null
    (assistant messages that only call tools).
    """

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class FunctionDef(_Lenient):
    """A function tool's declaration (JSON-schema ``parameters``)."""

    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolDef(_Lenient):
    """``tools[]`` entry; only ``type: "function"`` exists in this API."""

    type: Literal["function"] = "function"
    function: FunctionDef


class NamedFunction(_Lenient):
    """The function a named ``tool_choice`` forces."""

    name: str


class NamedToolChoice(_Lenient):
    """``tool_choice: {"type": "function", "function": {"name": ...}}``."""

    type: Literal["function"] = "function"
    function: NamedFunction


class StreamOptions(_Lenient):
    """``stream_options``: ``include_usage`` adds a final usage chunk."""

    include_usage: bool = False


class _SamplingFields(_Lenient):
    """Sampling fields both OpenAI endpoints accept."""

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    seed: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    n: int | None = Field(default=None, ge=1)
    logit_bias: dict[str, StrictInt | StrictFloat] | None = None  # a boolean is not a bias


class ChatCompletionRequest(_SamplingFields):
    """``POST /v1/chat/completions`` body."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: ReasoningEffort | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    logprobs: bool | None = None
    response_format: dict[str, Any] | None = None


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions`` body: ``prompt`` is text or token ids (one prompt per request)."""

    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=5)
    best_of: Literal[1] | None = None
    echo: bool = False
    suffix: str | None = None
    response_format: dict[str, Any] | None = None
