"""The feed / finish protocol shared by the streaming output parsers (``output``, ``harmony``).

A parser buffers generated text in ``_buf``, turns what is certain into events in ``_drain``
and counts the tool calls it emitted in ``_calls``.
"""

from __future__ import annotations

from freetoken.parsers.events import ParserEvent


class StreamParser:
    """Base of a streaming parser: subclasses implement :meth:`_drain`."""

    def __init__(self) -> None:
        self._buf = ""
        self._calls = 0
        self._finished = False
        self._truncated = False

    def feed(self, text: str) -> list[ParserEvent]:
        """Add generated text; returns the events that are now certain.

        Raises:
            TypeError: ``text`` is not a string.
            RuntimeError: called after :meth:`finish`.
        """
        if not isinstance(text, str):
            raise TypeError(f"feed() takes a str, got {type(text).__name__}")
        if self._finished:
            raise RuntimeError(f"{type(self).__name__}.feed() called after finish()")
        self._buf += text
        return self._drain(final=False)

    def finish(self, truncated: bool = False) -> list[ParserEvent]:
        """End of output: flush held text, settle an unterminated call, think block or message.

        Args:
            truncated: the output was cut by the token limit: a tool call it left unfinished is
                dropped (a cut-off call is neither a call nor answer text), where a call that
                ended malformed is returned as text.

        Raises:
            RuntimeError: called twice.
        """
        if self._finished:
            raise RuntimeError(f"{type(self).__name__}.finish() called twice")
        self._finished, self._truncated = True, truncated
        return self._drain(final=True)

    @property
    def num_tool_calls(self) -> int:
        """Number of ToolCallEvents emitted so far."""
        return self._calls

    def _drain(self, final: bool) -> list[ParserEvent]:
        """The events the buffer now settles (all of it when ``final``)."""
        raise NotImplementedError
