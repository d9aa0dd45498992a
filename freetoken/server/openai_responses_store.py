"""The in-memory store of past Responses API responses (``previous_response_id``, ``GET`` and
``DELETE /v1/responses/{id}``).

Bounded and least-recently-used: storing beyond ``max_items`` drops the response used longest
ago (a continuation from it then fails with ``previous_response_not_found``). Nothing survives a
restart. Each entry holds the whole conversation up to and including its output, so continuing
from it does not depend on its ancestors still being stored; entries share the item dicts of
their ancestors, which are never modified after they are stored.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

MAX_STORED_RESPONSES = 256


@dataclass(frozen=True)
class StoredResponse:
    """One stored response.

    Attributes:
        response: the response object as it was returned (``GET`` answers it).
        conversation: the input items of every turn so far and their output items, in order
            (without ``instructions``, which a continuation does not inherit).
    """

    response: dict
    conversation: tuple[dict, ...]

    @property
    def input_items(self) -> tuple[dict, ...]:
        """The items the response was generated from: the conversation without its output."""
        return self.conversation[: len(self.conversation) - len(self.response.get("output", ()))]


class ResponseStore:
    """Responses by id, least recently used first; safe to use from several threads (the
    routes read it from the worker thread that builds a prompt)."""

    def __init__(self, max_items: int = MAX_STORED_RESPONSES) -> None:
        if max_items < 1:
            raise ValueError(f"max_items must be >= 1, got {max_items}")
        self.max_items = max_items
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def get(self, response_id: str) -> StoredResponse | None:
        """The stored response (now the most recently used), or None."""
        with self._lock:
            stored = self._items.get(response_id)
            if stored is not None:
                self._items.move_to_end(response_id)
            return stored

    def put(self, response_id: str, stored: StoredResponse) -> None:
        """Store (or replace) a response, evicting the least recently used beyond the bound."""
        with self._lock:
            self._items[response_id] = stored
            self._items.move_to_end(response_id)
            while len(self._items) > self.max_items:
                self._items.popitem(last=False)

    def delete(self, response_id: str) -> bool:
        """Remove a response; False when it was not stored."""
        with self._lock:
            return self._items.pop(response_id, None) is not None
