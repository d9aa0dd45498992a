"""Random identifiers in the formats each API's clients expect."""

from __future__ import annotations

import secrets
import string

_ALNUM = string.ascii_letters + string.digits


def random_alnum(n: int) -> str:
    """``n`` random characters from ``[A-Za-z0-9]`` (``secrets`` source)."""
    return "".join(secrets.choice(_ALNUM) for _ in range(n))


def openai_tool_call_id() -> str:
    """``call_`` + 24 alphanumerics (the OpenAI tool-call id form)."""
    return "call_" + random_alnum(24)


def anthropic_tool_use_id() -> str:
    """``toolu_`` + 24 alphanumerics (the Anthropic tool_use id form)."""
    return "toolu_" + random_alnum(24)


def chat_completion_id() -> str:
    """``chatcmpl-`` + 24 alphanumerics."""
    return "chatcmpl-" + random_alnum(24)


def completion_id() -> str:
    """``cmpl-`` + 24 alphanumerics."""
    return "cmpl-" + random_alnum(24)


def message_id() -> str:
    """``msg_`` + 24 alphanumerics (the Anthropic message id form)."""
    return "msg_" + random_alnum(24)


def response_id() -> str:
    """``resp_`` + 24 alphanumerics (the Responses API response id form)."""
    return "resp_" + random_alnum(24)


def output_item_id(kind: str) -> str:
    """An output item id of the Responses API: ``msg_`` (message), ``rs_`` (reasoning),
    ``fc_`` (function call) or ``ctc_`` (custom tool call) + 24 alphanumerics; ``kind`` is that
    prefix without ``_``."""
    return f"{kind}_" + random_alnum(24)
