"""Whitespace hold-back shared by the streamed block / item builders (Anthropic content blocks,
Responses output items): whitespace-only text of a kind whose block is not open is held until
real content of that kind follows, so no blank block opens before a tool call or the end."""

from __future__ import annotations


class HeldWhitespace:
    """The held whitespace of one kind (``"text"``, ``"thinking"``, ...), or nothing."""

    def __init__(self) -> None:
        self._kind: str | None = None
        self._text = ""

    def admit(self, kind: str, text: str) -> str | None:
        """Text of ``kind`` arriving while its block is closed: None when it is whitespace only
        (held, after any held text of the same kind; held text of another kind is dropped),
        else the text to open the block with (the held whitespace of ``kind`` prepended)."""
        if not text.strip():
            if self._kind != kind:
                self._kind, self._text = kind, ""
            self._text += text
            return None
        if self._kind == kind:
            text = self._text + text
        self.drop()
        return text

    def drop(self) -> None:
        """Forget the held whitespace (a tool call or the end came first)."""
        self._kind, self._text = None, ""
