"""``GET /v1/responses/{id}/input_items``: the items a stored response was generated from.

The answer is OpenAI's list object ``{"object": "list", "data", "first_id", "last_id",
"has_more"}``. The items are the response's whole context without ``instructions``: every
earlier turn's input and output items (through ``previous_response_id``), then its own input.
Every item has an ``id``: input items sent without one get one when the response is created
(:func:`with_item_ids`), so an item keeps its id in every later response's list. A message whose
content was a plain string is listed with content parts (``input_text``, or ``output_text`` for
an assistant message), as OpenAI lists it.

Query parameters: ``limit`` (1 to 100, default 20), ``order`` (``asc`` or ``desc``, default
``desc``: newest first), ``after`` (an item id: list the items after it in that order);
``include`` is accepted and ignored.
"""

from __future__ import annotations

from collections.abc import Mapping

from freetoken.server.errors import bad_request
from freetoken.server.ids import output_item_id

DEFAULT_LIMIT, MAX_LIMIT = 20, 100
ORDERS = ("asc", "desc")
_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco",
              "custom_tool_call": "ctc", "custom_tool_call_output": "ctco", "reasoning": "rs"}


def with_item_ids(items: list[dict] | tuple[dict, ...]) -> tuple[dict, ...]:
    """``items`` with an ``id`` on each (a copy for an item that had none); the originals are
    not modified. Items are messages unless their ``type`` says otherwise."""
    out = []
    for item in items:
        if isinstance(item, dict) and not isinstance(item.get("id"), str):
            kind = item.get("type", "message")
            item = {**item, "id": output_item_id(_ID_PREFIX.get(kind, "item"))}
        out.append(item)
    return tuple(out)


def listed_item(item: dict) -> dict:
    """An item as the list shows it: a message gets ``type`` and content parts."""
    if item.get("type", "message") != "message":
        return item
    listed = {"type": "message", **item}
    if isinstance(listed.get("content"), str):
        part = "output_text" if listed.get("role") == "assistant" else "input_text"
        listed["content"] = [{"type": part, "text": listed["content"]}]
    return listed


def _limit(raw: str | None) -> int:
    if raw is None:
        return DEFAULT_LIMIT
    try:
        value = int(raw)
    except ValueError:
        raise bad_request(f"Invalid 'limit': expected an integer, but got '{raw}' instead.",
                          param="limit") from None
    if value < 1:
        raise bad_request("Invalid 'limit': integer below minimum value. Expected a value >= 1, "
                          f"but got {value} instead.", param="limit")
    if value > MAX_LIMIT:
        raise bad_request("Invalid 'limit': integer above maximum value. Expected a value <= "
                          f"{MAX_LIMIT}, but got {value} instead.", param="limit")
    return value


def list_input_items(response_id: str, items: tuple[dict, ...],
                     query: Mapping[str, str]) -> dict:
    """One page of ``items`` (oldest first, as stored) per the query parameters.

    Raises:
        APIError: 400 for a ``limit`` that is not an integer in [1, 100], an ``order`` other
            than ``asc`` / ``desc``, or an ``after`` that is not the id of one of the items.
    """
    limit = _limit(query.get("limit"))
    order = query.get("order", "desc")
    if order not in ORDERS:
        raise bad_request(f"Invalid value: '{order}'. Supported values are: 'asc' and 'desc'.",
                          param="order")
    ordered = list(items) if order == "asc" else list(reversed(items))
    after = query.get("after")
    if after is not None:
        ids = [item.get("id") for item in ordered]
        if after not in ids:
            raise bad_request(f"Invalid 'after': response '{response_id}' has no input item "
                              f"with id '{after}'.", param="after")
        ordered = ordered[ids.index(after) + 1:]
    page = [listed_item(item) for item in ordered[:limit]]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(ordered) > limit,
    }
