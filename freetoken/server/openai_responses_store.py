"""The in-memory store of past Responses API responses (``previous_response_id``, ``GET`` and
``DELETE /v1/responses/{id}``, ``GET /v1/responses/{id}/input_items``).

Bounded by count and by bytes, least recently used first: storing beyond ``max_items`` responses
or ``max_bytes`` drops the responses used longest ago until both hold (a continuation from one
then fails with ``previous_response_not_found``); a single response larger than ``max_bytes`` is
not kept at all (and evicts nothing). Nothing survives a restart. Each entry holds the whole
conversation up to and including its output, so continuing from it does not depend on its
ancestors still being stored; entries share the item dicts of their ancestors, which are never
modified after they are stored.

Bytes are those of the compact JSON text of what is held, each shared item counted once however
many entries hold it (a conversation of N turns costs its items once, not N times): every
distinct item of the conversations, plus each response object without its ``output`` (whose
items are the conversation's last ones).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass

MAX_STORED_RESPONSES = 256
MAX_STORED_BYTES = 256 * 1024 * 1024


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


def json_bytes(value: object) -> int:
    """Length in bytes of ``value``'s compact UTF-8 JSON text."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    return len(text.encode("utf-8"))


class ResponseStore:
    """Responses by id, least recently used first; safe to use from several threads (the
    routes read it from the worker thread that builds a prompt).

    Args:
        max_items: most responses kept.
        max_bytes: most bytes kept (see the module docstring for how they are counted).

    Raises:
        ValueError: a bound below 1.
    """

    def __init__(self, max_items: int = MAX_STORED_RESPONSES,
                 max_bytes: int = MAX_STORED_BYTES) -> None:
        if max_items < 1:
            raise ValueError(f"max_items must be >= 1, got {max_items}")
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._own_bytes: dict[str, int] = {}  # response id -> its response object's bytes
        self._held: dict[int, list] = {}  # id(item dict) -> [bytes, entries holding it]
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    @property
    def num_bytes(self) -> int:
        """Bytes held now."""
        with self._lock:
            return self._bytes

    def get(self, response_id: str) -> StoredResponse | None:
        """The stored response (now the most recently used), or None."""
        with self._lock:
            stored = self._items.get(response_id)
            if stored is not None:
                self._items.move_to_end(response_id)
            return stored

    def put(self, response_id: str, stored: StoredResponse) -> None:
        """Store (or replace) a response, then evict the least recently used until both bounds
        hold. A response whose own bytes (all its items counted) exceed ``max_bytes`` is not
        kept, and evicts nothing."""
        with self._lock:
            if response_id in self._items:
                self._drop(response_id)
            self._items[response_id] = stored
            if self._hold(response_id, stored) > self.max_bytes:
                self._drop(response_id)
                return
            while self._items and (len(self._items) > self.max_items
                                   or self._bytes > self.max_bytes):
                self._drop(next(iter(self._items)))

    def delete(self, response_id: str) -> bool:
        """Remove a response; False when it was not stored."""
        with self._lock:
            if response_id not in self._items:
                return False
            self._drop(response_id)
            return True

    def _hold(self, response_id: str, stored: StoredResponse) -> int:
        """Count ``stored`` in; returns its bytes alone (every item of its conversation)."""
        own = json_bytes({k: v for k, v in stored.response.items() if k != "output"})
        self._own_bytes[response_id] = own
        self._bytes += own
        alone = own
        for item in stored.conversation:
            held = self._held.get(id(item))
            if held is None:
                held = self._held[id(item)] = [json_bytes(item), 0]
                self._bytes += held[0]
            held[1] += 1
            alone += held[0]
        return alone

    def _drop(self, response_id: str) -> None:
        stored = self._items.pop(response_id)
        self._bytes -= self._own_bytes.pop(response_id)
        for item in stored.conversation:
            held = self._held[id(item)]
            held[1] -= 1
            if held[1] == 0:
                del self._held[id(item)]
                self._bytes -= held[0]
