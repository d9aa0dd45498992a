"""Renders chat templates in a sandboxed jinja2 environment (interface; implementation pending)."""

from __future__ import annotations

from pathlib import Path


class ChatTemplate:
    """A jinja chat template (HF semantics) rendered in ``jinja2.sandbox.ImmutableSandboxedEnvironment``.

    Messages use the OpenAI-normalised form:
    ``{"role": "system"|"user"|"assistant"|"tool", "content": str}``; assistant messages may
    carry ``reasoning_content`` (str) and ``tool_calls`` (``[{"id", "type": "function",
    "function": {"name", "arguments": dict | str}}]``); tool messages carry ``tool_call_id``.
    Tools are ``[{"type": "function", "function": {"name", "description", "parameters"}}]``.
    """

    def __init__(self, source: str) -> None:
        raise NotImplementedError

    @classmethod
    def for_model(cls, checkpoint_template: str | None, model_type: str) -> "ChatTemplate":
        """The checkpoint's own template when present, else ``templates/<model_type>.jinja``."""
        raise NotImplementedError

    def render(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool | None = None,
    ) -> str:
        """Render the prompt text (special tokens written as text, e.g. ``<|im_start|>``)."""
        raise NotImplementedError
