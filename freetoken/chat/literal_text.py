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

Escaped: the ``content`` (a string, or the ``text`` of content parts) of every turn except the
assistant's. Assistant turns hold the model's own earlier output, which templates parse (Qwen3
splits ``<think>…</think>`` out of the content), and rendering them as generated keeps prefix
reuse exact. A template that inspects user text for markup (Qwen3 treats a user turn wrapped in
``<tool_response>`` as a tool result) sees the placeholder instead and treats the turn as text.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Protocol

OPEN, CLOSE = "\ue000", "\ue001"
_PLACEHOLDER = re.compile(f"{OPEN}(\\d+){CLOSE}")


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
        literals: the strings escaped: the tokenizer's added tokens (longest first), then the two
            placeholder characters.
    """

    def __init__(self, added_tokens: tuple[str, ...]) -> None:
        self.literals = (*added_tokens, OPEN, CLOSE)
        self._index = {s: i for i, s in enumerate(self.literals)}
        self._pattern = re.compile("|".join(re.escape(s) for s in self.literals))

    def escape_text(self, text: str) -> str:
        """``text`` with every literal replaced by its placeholder."""
        return self._pattern.sub(lambda m: f"{OPEN}{self._index[m.group(0)]}{CLOSE}", text)

    def escape_messages(self, messages: list[Any]) -> list[Any]:
        """Copies of ``messages`` with their text escaped (see the module docstring); values that
        are not message dicts of the expected shape are passed on unchanged for the template's
        own checks to report."""
        return [self._escape_message(m) for m in messages]

    def _escape_message(self, message: Any) -> Any:
        if not isinstance(message, dict) or message.get("role") == "assistant":
            return message
        content = message.get("content")
        if isinstance(content, str):
            return {**message, "content": self.escape_text(content)}
        if isinstance(content, list):
            parts = [
                {**p, "text": self.escape_text(p["text"])}
                if isinstance(p, dict) and isinstance(p.get("text"), str) else p
                for p in content
            ]
            return {**message, "content": parts}
        return message

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
