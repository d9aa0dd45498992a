"""Message text that never yields an added (special) token id: the prompt-injection guard.

A chat template renders to one string that is then tokenised, and the tokenizer maps every added
token written in that string (``<|im_end|>``, ``<|start|>``, ``<|observation|>``, ``<think>``…) to
its id. Text a client passes along (a user turn, a tool result holding a web page) could then
close its turn and open a forged system turn. So before rendering, every added-token string in
message text is replaced by a placeholder (``\\ue000<n>\\ue001``: private-use characters around
``n``, the string's index in :attr:`LiteralText.literals`); after rendering, the text gets the
original characters back and the token ids get the ids of those characters read as plain text
(``Tokenizer.encode_plain``). The template's own markup is never touched, so only the template's
structure yields added-token ids. The placeholder characters are themselves escaped the same
way, so a client cannot forge one.

Escaped: every string of every message but its ``role`` (content and content parts,
reasoning, tool-call names, ids and arguments, tool names) and of the tool definitions. Equal
strings escape equally, so a template comparing a call's name with a tool's still matches. One
exception: in assistant turns the tags the model itself writes inside its turn and templates
parse (:data:`MODEL_MARKUP`: ``<think>``, ``<tool_call>``, ``<arg_key>``…) stay markup, so
``<think>…</think>`` in an assistant content is still split out by Qwen3's template and an
unparsed tool call renders as it was generated. Turn delimiters are escaped in assistant turns
too: a model that wrote ``<|im_end|>`` as text (an agent editing a tokenizer file) wrote
plain-text ids, and its history must not turn them into an end of turn. A template that inspects
user text for markup (Qwen3 treats a user turn wrapped in ``<tool_response>`` as a tool result)
sees the placeholder instead and treats the turn as text. :data:`USER_SWITCHES` (GLM's
``/nothink``) stay tokens in every turn.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Protocol

from freetoken.chat.messages import parse_arguments

OPEN, CLOSE = "\ue000", "\ue001"
_PLACEHOLDER = re.compile(f"{OPEN}(\\d+){CLOSE}")
MODEL_MARKUP = frozenset({
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
    "<arg_value>", "</arg_value>",
})
"""Tags a model writes inside its own turn that templates parse out of an assistant content;
kept as markup in assistant turns (never in others)."""
USER_SWITCHES = frozenset({"/nothink"})
"""Added tokens a person is meant to type (GLM-4.5's ``/nothink`` ends a user turn to turn
thinking off, and its template tests the content for it): kept in every turn."""


def _alternation(literals: tuple[str, ...]) -> re.Pattern:
    return re.compile("|".join(re.escape(s) for s in literals))


class LiteralTokenizer(Protocol):
    """What the guard needs of a tokenizer (:class:`freetoken.tokenizer.tokenizer.Tokenizer`)."""

    added_token_strings: tuple[str, ...]

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``, added tokens matched."""
        ...

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        """Ids of each text, added tokens matched."""
        ...

    def encode_plain(self, text: str) -> list[int]:
        """Ids of ``text`` read as plain characters."""
        ...


class LiteralText:
    """Escapes added-token strings in message text and tokenises the rendered prompt.

    Attributes:
        literals: the tokenizer's added tokens (longest first), then the two placeholder
            characters; all but :data:`USER_SWITCHES` are escaped.
    """

    def __init__(self, added_tokens: tuple[str, ...]) -> None:
        self.literals = (*added_tokens, OPEN, CLOSE)
        self._index = {s: i for i, s in enumerate(self.literals)}
        escaped = tuple(s for s in self.literals if s not in USER_SWITCHES)
        self._all = _alternation(escaped)
        self._assistant = _alternation(tuple(s for s in escaped if s not in MODEL_MARKUP))

    def escape_text(self, text: str, keep_model_markup: bool = False) -> str:
        """``text`` with every literal replaced by its placeholder (but the
        :data:`MODEL_MARKUP` tags when ``keep_model_markup``)."""
        pattern = self._assistant if keep_model_markup else self._all
        return pattern.sub(lambda m: f"{OPEN}{self._index[m.group(0)]}{CLOSE}", text)

    def escape_data(self, value: Any, keep_model_markup: bool = False) -> Any:
        """A copy of ``value`` with every string in it (dict keys included) escaped; other
        values are passed on unchanged."""
        if isinstance(value, str):
            return self.escape_text(value, keep_model_markup)
        if isinstance(value, list):
            return [self.escape_data(v, keep_model_markup) for v in value]
        if isinstance(value, dict):
            return {self.escape_data(k, keep_model_markup) if isinstance(k, str) else k:
                    self.escape_data(v, keep_model_markup) for k, v in value.items()}
        return value

    def escape_tools(self, tools: list[Any] | None) -> list[Any] | None:
        """A copy of the tool definitions with every string escaped (descriptions, schemas,
        names)."""
        return None if tools is None else self.escape_data(list(tools))

    def escape_messages(self, messages: list[Any]) -> list[Any]:
        """Copies of ``messages`` with their text escaped (see the module docstring); values that
        are not message dicts of the expected shape are passed on unchanged for the template's
        own checks to report."""
        return [self._escape_message(m) for m in messages]

    def _escape_message(self, message: Any) -> Any:
        if not isinstance(message, dict):
            return message
        assistant = message.get("role") == "assistant"
        out = {}
        for key, value in message.items():
            if key == "role":
                out[key] = value
            elif key == "tool_calls" and isinstance(value, list):
                out[key] = [self._escape_call(c) for c in value]
            else:
                out[key] = self.escape_data(value, keep_model_markup=assistant)
        return out

    def _escape_call(self, call: Any) -> Any:
        """A tool call with every string escaped (name, id, arguments; also under
        ``function``). Arguments given as a JSON-object string are parsed first (as
        ``ChatTemplate`` would), so a literal written with JSON escapes (``\\u003c|im_end|>``)
        is caught once decoded."""
        if not isinstance(call, dict):
            return self.escape_data(call)
        out = {}
        for key, value in call.items():
            if key == "function" and isinstance(value, dict):
                out[key] = self._escape_call(value)
            elif key == "arguments":
                out[key] = self.escape_data(parse_arguments(value))
            else:
                out[key] = self.escape_data(value)
        return out

    def restore(self, rendered: str) -> str:
        """The rendered prompt with every placeholder turned back into its literal."""
        if OPEN not in rendered:
            return rendered
        return _PLACEHOLDER.sub(lambda m: self.literals[int(m.group(1))], rendered)

    def encode(self, tokenizer: LiteralTokenizer, rendered: str) -> list[int]:
        """Token ids of the rendered prompt: the template's text with added tokens matched, each
        placeholder as the plain-text ids of its literal.

        Raises:
            IndexError: a placeholder index that is not one of :attr:`literals` (only a
                rendering that did not come from :meth:`escape_messages` can hold one).
        """
        if OPEN not in rendered:
            return tokenizer.encode(rendered)
        segments, literal_ids = [], []
        pos = 0
        for match in _PLACEHOLDER.finditer(rendered):
            segments.append(rendered[pos:match.start()])
            literal_ids.append(int(match.group(1)))
            pos = match.end()
        segments.append(rendered[pos:])
        encoded = tokenizer.encode_many(segments)
        plain = {i: tokenizer.encode_plain(self.literals[i]) for i in set(literal_ids)}
        ids = list(encoded[0])
        for i, segment_ids in zip(literal_ids, encoded[1:]):
            ids += plain[i]
            ids += segment_ids
        return ids


@lru_cache(maxsize=8)
def literal_text(added_tokens: tuple[str, ...]) -> LiteralText:
    """The guard for a tokenizer's added tokens (built once per token set)."""
    return LiteralText(added_tokens)
