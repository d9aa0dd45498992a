"""Rendering a conversation into prompt token ids, and the context-length check.

The chat template (:class:`freetoken.chat.template.ChatTemplate`) and the output parser
(:mod:`freetoken.parsers`) are reached through the two small protocols below so the HTTP layer can
be tested with stand-ins.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, get_args

from jinja2 import TemplateError

from freetoken.chat.literal_text import literal_text
from freetoken.parsers import opens_harmony_reply, prompt_opens_reasoning
from freetoken.parsers.events import ParserEvent
from freetoken.server.errors import Api, APIError, bad_request
from freetoken.server.openai_protocol import ReasoningEffort
from freetoken.tokenizer.tokenizer import Tokenizer


class PromptTemplate(Protocol):
    """What the server needs of a chat template (``ChatTemplate.render``)."""

    def render(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool | None = None,
        **template_kwargs: str,
    ) -> str:
        """Prompt text of ``messages`` (see ``ChatTemplate.render``); ``template_kwargs`` is
        ``reasoning_effort``, passed only when the request sets one."""
        ...


class OutputParserLike(Protocol):
    """What the server needs of an output parser: streaming ``feed`` and a final ``finish``."""

    def feed(self, text: str) -> Iterable[ParserEvent]:
        """Events made certain by the new ``text``."""
        ...

    def finish(self, truncated: bool = False) -> Iterable[ParserEvent]:
        """Events left at the end of output (``truncated``: cut by the token limit, so an
        unfinished tool call is dropped)."""
        ...


# (tools, *, in_reasoning, parse_tools) -> parser; ``freetoken.parsers.OutputParser`` fits.
ParserFactory = Callable[..., OutputParserLike]


@dataclass(frozen=True)
class Prompt:
    """A rendered prompt.

    Attributes:
        text: the template output (special tokens written as text).
        token_ids: its token ids, as the engine will prefill them.
        in_reasoning: True when the prompt ends by opening a reasoning block (``<think>``), so the
            model's first tokens are reasoning and the parser must start inside it; for a
            harmony prompt (ending ``<|start|>assistant``), True unless thinking was turned off:
            the model may open an analysis message (a forced call's grammar allows one; the
            harmony parser reads each message's channel and ignores this).
    """

    text: str
    token_ids: tuple[int, ...]
    in_reasoning: bool


def render_prompt(
    template: PromptTemplate,
    tokenizer: Tokenizer,
    messages: list[dict],
    tools: list[dict] | None,
    enable_thinking: bool | None,
    reasoning_effort: str | None = None,
) -> Prompt:
    """Render ``messages`` (+ ``tools``) with the generation prompt and tokenize the result.

    ``in_reasoning`` follows :func:`freetoken.parsers.prompt_opens_reasoning` (the last turn
    opened ``<think>`` and did not close it, e.g. a generation prompt ending in ``<think>\n``),
    or for a harmony prompt :func:`freetoken.parsers.opens_harmony_reply` with thinking not off.
    ``reasoning_effort`` (``low`` / ``medium`` / ``high``, see :func:`harmony_effort`) reaches the
    template only when not None.

    CPU-heavy for agent-sized prompts (tens of thousands of tokens): the routes call it through a
    worker thread, and tokenisation goes through ``Tokenizer.encode_many`` so it does not hold
    the GIL.

    Added-token strings in message text and tool definitions (``<|im_end|>`` in a user message,
    a tool result or a tool call's arguments) are tokenised as plain text
    (:mod:`freetoken.chat.literal_text`): only the template's own markup, and the reasoning /
    tool-call tags of assistant turns, yield added-token ids.

    Raises:
        APIError: 400 when the template rejects the conversation (``ChatTemplate``'s
            ``TemplateError``, jinja errors, type/key errors from a template, or a structure
            nested too deeply to render, e.g. a tool schema nested hundreds of levels).
    """
    extra = {} if reasoning_effort is None else {"reasoning_effort": reasoning_effort}
    guard = literal_text(tokenizer.added_token_strings)
    try:
        rendered = template.render(
            guard.escape_messages(messages), tools=guard.escape_tools(tools),
            add_generation_prompt=True, enable_thinking=enable_thinking, **extra,
        )
    except RecursionError:
        raise bad_request(
            "chat template error: the conversation or tool schemas are nested too deeply",
            param="messages",
        ) from None
    except (TemplateError, ValueError, TypeError, KeyError, IndexError) as exc:
        message = str(exc)
        if not message.startswith("chat template"):
            message = f"chat template error: {message}"
        raise bad_request(message, param="messages") from None
    text = guard.restore(rendered)
    if opens_harmony_reply(text):
        in_reasoning = enable_thinking is not False
    else:
        in_reasoning = prompt_opens_reasoning(text)
    return Prompt(text, tuple(guard.encode(tokenizer, rendered)), in_reasoning)


def encode_text(tokenizer: Tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` (no special tokens added); ``Tokenizer.encode`` releases the GIL,
    so a megabyte prompt tokenised in a worker thread does not freeze the event loop."""
    return list(tokenizer.encode(text))


def check_context(num_prompt_tokens: int, max_model_len: int, api: Api, param: str) -> None:
    """Reject a prompt that leaves no room for one output token.

    Raises:
        APIError: 400 when ``num_prompt_tokens + 1 > max_model_len``; OpenAI code
            ``context_length_exceeded``, Anthropic message ``prompt is too long: N tokens > M
            maximum`` (the wording Claude Code parses to trigger compaction).
    """
    if num_prompt_tokens + 1 <= max_model_len:
        return
    if api == "anthropic":
        raise APIError(
            400, f"prompt is too long: {num_prompt_tokens} tokens > {max_model_len - 1} maximum"
        )
    raise APIError(
        400,
        f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
        f"has {num_prompt_tokens} tokens, which leaves no room for output. Please reduce the "
        f"length of the {param}.",
        param=param,
        code="context_length_exceeded",
    )


def thinking_from_kwargs(kwargs: dict | None, effort: str | None) -> bool | None:
    """``enable_thinking`` of an OpenAI request: ``chat_template_kwargs.enable_thinking`` (or
    ``thinking``) wins, else ``reasoning_effort`` (``"none"`` → False, any other level → True),
    else None (the template's default).

    Raises:
        APIError: 400 when the kwarg is not a boolean.
    """
    for key in ("enable_thinking", "thinking"):
        if kwargs and key in kwargs:
            value = kwargs[key]
            if not isinstance(value, bool):
                raise bad_request(
                    f"chat_template_kwargs.{key}: Input should be a valid boolean",
                    param=f"chat_template_kwargs.{key}",
                )
            return value
    if effort is None:
        return None
    return effort != "none"


OPENAI_EFFORTS: tuple[str, ...] = get_args(ReasoningEffort)
"""OpenAI's ``reasoning_effort`` levels, lowest first."""
_EFFORTS = {"none": "low", "minimal": "low", "low": "low", "medium": "medium", "high": "high",
            "xhigh": "high", "max": "high"}


def harmony_effort(effort: object) -> str | None:
    """A requested reasoning effort as one of harmony's ``Reasoning:`` levels (``low`` /
    ``medium`` / ``high``): ``none`` / ``minimal`` → ``low``, ``xhigh`` / ``max`` → ``high``
    (case-insensitive), anything else None (the template's default). gpt-oss cannot turn
    reasoning off, so the lowest level stands in for "no reasoning"."""
    return _EFFORTS.get(effort.strip().lower()) if isinstance(effort, str) else None


def effort_from_kwargs(kwargs: dict | None, effort: str | None) -> str | None:
    """``reasoning_effort`` of an OpenAI request for the template: ``chat_template_kwargs.
    reasoning_effort`` wins, else the ``reasoning_effort`` field (already one of OpenAI's
    levels), both through :func:`harmony_effort`; None when neither names a level.

    Raises:
        APIError: 400 when ``chat_template_kwargs.reasoning_effort`` is set (not null) but is
            not one of :data:`OPENAI_EFFORTS` (case-insensitive).
    """
    if kwargs and kwargs.get("reasoning_effort") is not None:
        level = harmony_effort(kwargs["reasoning_effort"])
        if level is None:
            levels = ", ".join(f"'{e}'" for e in OPENAI_EFFORTS[:-1])
            levels += f" or '{OPENAI_EFFORTS[-1]}'"
            raise bad_request(f"chat_template_kwargs.reasoning_effort: Input should be {levels}",
                              param="chat_template_kwargs.reasoning_effort")
        return level
    return harmony_effort(effort)
