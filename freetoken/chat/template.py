"""Renders chat templates in a sandboxed jinja2 environment with Hugging Face semantics.

Follows ``transformers`` ``apply_chat_template`` (``utils/chat_template_utils.py``): the template
gets ``messages``, ``tools``, ``add_generation_prompt``, the special-token strings and any extra
keyword (``enable_thinking``…); a keyword left as ``None`` is not passed, so the template sees it
as undefined. The environment is built in :mod:`freetoken.chat.sandbox`, the inputs are cleaned
by :mod:`freetoken.chat.messages`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2

from freetoken import paths
from freetoken.chat.messages import MessageFormatError, normalize_messages, normalize_tools, plain_data
from freetoken.chat.sandbox import TemplateRaised, make_environment

_MODEL_TYPE = re.compile(r"[a-z0-9][a-z0-9_]*")
BUNDLED_FIRST = frozenset({"gpt_oss"})  # families served with templates/<model_type>.jinja


class TemplateError(ValueError):
    """A chat template could not render the request (the API answers 400 with this message).

    Raised for: a template that does not compile, ``raise_exception(...)`` called by the template,
    any jinja error while rendering (undefined value used, sandbox refusal, type error), and
    messages/tools that are not plain JSON data of the expected shape.
    """


class ChatTemplate:
    """A jinja chat template (HF semantics) rendered in ``jinja2.sandbox.ImmutableSandboxedEnvironment``.

    Messages use the OpenAI-normalised form:
    ``{"role": "system"|"user"|"assistant"|"tool", "content": str}``; assistant messages may
    carry ``reasoning_content`` (str) and ``tool_calls`` (``[{"id", "type": "function",
    "function": {"name", "arguments": dict | str}}]``); tool messages carry ``tool_call_id``.
    Tools are ``[{"type": "function", "function": {"name", "description", "parameters"}}]``.

    Attributes:
        source: the jinja text.
        name: a label used in error messages (``"qwen3_moe"``, ``"checkpoint"``…).
    """

    def __init__(
        self,
        source: str,
        *,
        name: str = "custom",
        special_tokens: Mapping[str, str | None] | None = None,
        flatten_text_parts: bool = True,
        parse_tool_arguments: bool = True,
    ) -> None:
        """Compile ``source``.

        Args:
            source: jinja template text.
            name: label for error messages.
            special_tokens: strings passed to the template as variables, as HF does
                (``{"eos_token": "<|im_end|>", "bos_token": None, …}``).
            flatten_text_parts: join content lists made only of text parts into a string before
                rendering (see :func:`freetoken.chat.messages.normalize_messages`).
            parse_tool_arguments: turn tool-call ``arguments`` strings holding a JSON object into
                dicts before rendering.

        Raises:
            TemplateError: ``source`` is not a string or does not compile.
        """
        if not isinstance(source, str):
            raise TemplateError(f"chat template {name}: source must be a string, got {type(source).__name__}")
        self.source = source
        self.name = name
        self._special = dict(special_tokens or {})
        self._flatten = flatten_text_parts
        self._parse_args = parse_tool_arguments
        try:
            self._compiled = make_environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(f"chat template {name} does not compile: line {exc.lineno}: {exc.message}") from exc

    @classmethod
    def for_model(cls, checkpoint_template: str | None, model_type: str, **options: Any) -> "ChatTemplate":
        """The checkpoint's own template when present, else ``templates/<model_type>.jinja``.

        gpt-oss always takes the bundled harmony template (:data:`BUNDLED_FIRST`): the
        released one reads reasoning from ``thinking`` (the API messages carry
        ``reasoning_content``) and refuses an assistant message holding both text and reasoning,
        which agent histories contain.

        Args:
            checkpoint_template: the template shipped with the checkpoint
                (``Tokenizer.chat_template``), or None / ``""`` when it has none.
            model_type: ``config.json`` ``model_type`` (``"qwen3_moe"``, ``"qwen3_next"``…).
            **options: passed to the constructor (``special_tokens``…).

        Raises:
            ValueError: no checkpoint template and no ``templates/<model_type>.jinja``.
            TemplateError: the chosen template does not compile.
        """
        if checkpoint_template and model_type not in BUNDLED_FIRST:
            return cls(checkpoint_template, name="checkpoint", **options)
        if not isinstance(model_type, str) or not _MODEL_TYPE.fullmatch(model_type):
            raise ValueError(f"invalid model_type {model_type!r} for a chat template")
        path = Path(paths.TEMPLATES_DIR) / f"{model_type}.jinja"
        if not path.is_file():
            known = sorted(p.stem for p in Path(paths.TEMPLATES_DIR).glob("*.jinja"))
            raise ValueError(
                f"no chat template for model_type {model_type!r}: the checkpoint has none and "
                f"templates/{model_type}.jinja does not exist (available: {', '.join(known) or 'none'})"
            )
        return cls(path.read_text(encoding="utf-8"), name=model_type, **options)

    def render(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool | None = None,
        **template_kwargs: Any,
    ) -> str:
        """Render the prompt text (special tokens written as text, e.g. ``<|im_start|>``).

        Args:
            messages: the conversation (see the class docstring); not modified.
            tools: tool definitions, or None.
            add_generation_prompt: append the assistant opening (and think-block prefix).
            enable_thinking: passed to the template when not None.
            **template_kwargs: further template variables (``None`` values are not passed).

        Raises:
            TemplateError: bad message/tool shape, ``raise_exception`` in the template, or any
                jinja error while rendering.
        """
        try:
            context: dict[str, Any] = {
                key: plain_data(value, key) for key, value in self._special.items() if value is not None
            }
            for key, value in template_kwargs.items():
                if value is not None:
                    context[key] = plain_data(value, key)
            if enable_thinking is not None:
                context["enable_thinking"] = bool(enable_thinking)
            context["messages"] = normalize_messages(
                messages, flatten_text_parts=self._flatten, parse_tool_arguments=self._parse_args
            )
            context["tools"] = normalize_tools(tools)
            context["add_generation_prompt"] = bool(add_generation_prompt)
        except MessageFormatError as exc:
            raise TemplateError(f"chat template {self.name}: {exc}") from exc
        try:
            return self._compiled.render(**context)
        except TemplateRaised as exc:
            raise TemplateError(f"chat template {self.name}: {exc.message}") from exc
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template {self.name} failed: {type(exc).__name__}: {exc.message}") from exc
        except (TypeError, ValueError, LookupError, ArithmeticError, AttributeError, RecursionError) as exc:
            raise TemplateError(f"chat template {self.name} failed: {type(exc).__name__}: {exc}") from exc
