"""Stop-string matching on streamed text, with holdback of possible stop-string prefixes.

Text arrives in chunks that do not line up with stop strings (a stop string may span several
tokens). The matcher keeps a *pending* tail: the longest suffix of the text seen so far that
is a proper prefix of some stop string. That tail is held back from the stream until the next
chunk either completes a stop string (the stop string and everything after it are dropped)
or rules it out (the tail is released). Because everything before the tail cannot start a
match, each search only scans the pending tail plus the new chunk: O(new text + longest stop)
per step. Follows the OpenAI ``stop`` semantics (the matched string is not returned) and
vLLM's ``StopChecker``/``include_stop_str_in_output=False`` behaviour.
"""

from __future__ import annotations


class StopStringMatcher:
    """Per-request stop-string state.

    Args:
        stops: the stop strings (each non-empty).

    Raises:
        ValueError: a stop string is empty.
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        self._stops = stops
        self._max_hold = max((len(s) for s in stops), default=1) - 1
        self._pending = ""

    def feed(self, text: str) -> tuple[str, str | None]:
        """Add newly decoded ``text``.

        Returns:
            ``(emit, matched)``: the text now safe to stream, and the matched stop string (the
            earliest match in the text; list order breaks ties) or None. After a match the
            caller must stop generation; ``emit`` is the text before the match.
        """
        if not self._stops:
            return text, None
        pending = self._pending + text
        best: tuple[int, str] | None = None
        for stop in self._stops:
            at = pending.find(stop)
            if at >= 0 and (best is None or at < best[0]):
                best = (at, stop)
        if best is not None:
            self._pending = ""
            return pending[: best[0]], best[1]
        hold = self._holdback(pending)
        self._pending = pending[len(pending) - hold :] if hold else ""
        return pending[: len(pending) - hold], None

    def flush(self) -> str:
        """Release the held-back tail (generation ended without completing a stop string)."""
        tail, self._pending = self._pending, ""
        return tail

    def _holdback(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        for n in range(min(len(text), self._max_hold), 0, -1):
            suffix = text[-n:]
            if any(stop.startswith(suffix) for stop in self._stops):
                return n
        return 0
