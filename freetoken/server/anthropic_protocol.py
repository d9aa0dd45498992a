"""Request bodies of the Anthropic Messages API (``/v1/messages``, ``/v1/messages/count_tokens``).

Follows docs.anthropic.com "Messages" and "Count message tokens". Content blocks stay plain dicts
here and are validated one by one in :mod:`freetoken.server.anthropic_messages` (so an error names
the exact block field). Unknown top-level fields (``metadata``, ``context_management``,
``cache_control``, ``service_tier``...) are accepted and ignored; of ``output_config`` ``effort``
(one of :data:`EFFORTS`, checked by ``anthropic_chat.check_effort``) and a ``format`` are read
(other keys are ignored); ``format`` and the older top-level
``output_format`` are validated and served by :mod:`freetoken.server.structured`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


MIN_THINKING_BUDGET = 1024
EFFORTS = ("low", "medium", "high", "xhigh", "max")
"""``output_config.effort`` levels the Anthropic SDK lists (``OutputConfigParam``)."""


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class AnthropicMessage(_Lenient):
    """One turn; ``system`` turns inside ``messages`` (Claude Code ≥ 2.1.154) render in place."""

    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class AnthropicTool(_Lenient):
    """A client tool (``type`` absent or ``custom``); server tools are rejected by the route."""

    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )
    type: str | None = None


class AnthropicToolChoice(_Lenient):
    """``{"type": "auto"|"any"|"tool"|"none", "name"?: str}``."""

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(_Lenient):
    """``thinking``: ``enabled`` (with ``budget_tokens``, at least 1024 as on Anthropic's API),
    ``adaptive`` or ``disabled``."""

    type: Literal["enabled", "adaptive", "disabled"]
    budget_tokens: int | None = Field(default=None, ge=MIN_THINKING_BUDGET)

    @model_validator(mode="after")
    def _enabled_needs_a_budget(self) -> "ThinkingConfig":
        if self.type == "enabled" and self.budget_tokens is None:
            raise ValueError("budget_tokens is required when thinking is enabled")
        return self


class CountTokensRequest(_Lenient):
    """``POST /v1/messages/count_tokens`` body."""

    model: str | None = None
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: Any = None


class MessagesRequest(CountTokensRequest):
    """``POST /v1/messages`` body. ``max_tokens`` is required, as on Anthropic's API (every
    client sends it; the server cap clamps it); ``temperature`` is in [0, 1] there."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    seed: int | None = None
    ignore_eos: bool = False
    output_format: Any = None
