"""The harness-adapter interface: request facts, edit boundaries and the adapter base class.

An adapter knows one agent harness (Claude Code, OpenCode, OpenClaw, SWE-agent, mini-swe-agent):
how to recognise its requests, where it rewrites its own history between model calls (its *edit
boundaries*, shared/research/harnesses.md §1b-§5b), which checkpoint kinds cover those rewrites
(an :class:`~freetoken.prefix.anchors.AnchorPolicy`), which per-request prefix busters can be
removed before templating without changing meaning, and a pure simulator of its edits.

Messages are in template form, the output of ``freetoken.server.messages.from_openai`` /
``from_anthropic``: dicts with ``role`` system|user|assistant|tool, ``content`` str, optional
``reasoning_content`` (str), ``tool_calls`` (``[{"id", "type": "function", "function": {"name",
"arguments"}}]``) and ``tool_call_id`` on tool messages; system messages may appear anywhere.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, Literal

from freetoken.prefix.anchors import AnchorKind, AnchorPolicy
from harness_adapters.history import check_messages

Version = tuple[int, ...]

# Every harness gets these checkpoints: the start of each turn, the start of each generation
# (B0 below) and the end of each generation (the tail the next request re-renders).
BASE_ANCHORS = frozenset({AnchorKind.TURN_START, AnchorKind.GENERATION_START,
                          AnchorKind.GENERATION_END})
_APIS = ("openai", "anthropic")
_VERSION = re.compile(r"(\d+(?:\.\d+)*)")


def parse_version(text: str, parts: int | None = None) -> Version | None:
    """The first dotted run of integers in ``text`` (``"2.1.197"`` → ``(2, 1, 197)``), or None.

    Args:
        text: e.g. the part of a User-Agent after ``claude-cli/``.
        parts: keep at most this many components (Claude Code's ``cc_version=2.1.197.f3a`` has
            a hex suffix that is not part of the version).

    Raises:
        TypeError: ``text`` is not a string.
    """
    if not isinstance(text, str):
        raise TypeError(f"version text must be a string, got {type(text).__name__}")
    match = _VERSION.search(text)
    if match is None:
        return None
    # a component longer than 9 digits is not a real version (and int() of thousands of digits
    # is refused by Python): treat the text as carrying no version
    pieces = match.group(1).split(".")
    if any(len(p) > 9 for p in pieces):
        return None
    numbers = tuple(int(p) for p in pieces)
    return numbers[:parts] if parts else numbers


def agent_version(user_agent: str, product: str) -> Version | None:
    """Version of ``product`` in a User-Agent (``"opencode/1.18.33 ai-sdk/..."``, product
    ``"opencode"`` → ``(1, 18, 33)``); None when the product token is absent."""
    match = re.search(rf"(?:^|[\s(;]){re.escape(product)}/(\d+(?:\.\d+)*)", user_agent, re.I)
    return parse_version(match.group(1)) if match else None


def _check_version(version: object, what: str) -> None:
    if version is not None and not (
        isinstance(version, tuple) and version
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in version)
    ):
        raise TypeError(f"{what} must be None or a non-empty tuple of non-negative ints, got {version!r}")


@dataclass(frozen=True)
class RequestInfo:
    """What an adapter may look at to recognise a request.

    Attributes:
        api: API family of the endpoint, ``"openai"`` or ``"anthropic"``.
        path: the endpoint path without query (``"/v1/chat/completions"``, ``"/v1/messages"``,
            ``"/v1/completions"``, ``"/v1/messages/count_tokens"``).
        headers: request headers; stored with lower-cased names (read-only view).
        body: the parsed JSON body, raw (before pydantic validation); fields of any shape.

    Raises:
        ValueError: ``api`` is not ``"openai"`` or ``"anthropic"``.
        TypeError: ``path`` is not a string, ``headers`` or ``body`` not a mapping.
    """

    api: Literal["openai", "anthropic"]
    path: str
    headers: Mapping[str, str]
    body: Mapping[str, Any]

    def __post_init__(self) -> None:
        if self.api not in _APIS:
            raise ValueError(f"RequestInfo.api must be one of {_APIS}, got {self.api!r}")
        if not isinstance(self.path, str):
            raise TypeError(f"RequestInfo.path must be a string, got {type(self.path).__name__}")
        if not isinstance(self.headers, Mapping):
            raise TypeError(f"RequestInfo.headers must be a mapping, got {type(self.headers).__name__}")
        if not isinstance(self.body, Mapping):
            raise TypeError(f"RequestInfo.body must be a JSON object (mapping), got {type(self.body).__name__}")
        lowered = {str(k).lower(): str(v) for k, v in self.headers.items()}
        object.__setattr__(self, "headers", MappingProxyType(lowered))

    def header(self, name: str) -> str:
        """Value of header ``name`` (case-insensitive), ``""`` when absent."""
        return self.headers.get(name.lower(), "")


@dataclass(frozen=True)
class EditBoundary:
    """One place where a harness (or the chat template) rewrites history between model calls.

    Attributes:
        code: id from shared/research/harnesses.md (``"C1"``, ``"E1"``, ``"P2"``, ``"S1"``,
            ``"B0"``...).
        block: what is rewritten, one line.
        anchor: the anchor kind whose checkpoint lands at, or just before, the first changed
            token of the rewritten prompt.
        default_on: the edit rewrites tokens the server has already seen under the harness's
            default configuration. Edits that are opt-in, server-side, or fixed when the block is
            first sent (never a moving edit, e.g. C7, E7) are False.
        since: first harness version where it applies (None: always).
        until: first harness version where it no longer applies (None: still applies).

    Raises:
        TypeError: a field of the wrong type.
        ValueError: empty ``code``, or ``since >= until``.
    """

    code: str
    block: str
    anchor: AnchorKind
    default_on: bool
    since: Version | None = None
    until: Version | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.code, str) or not self.code:
            raise ValueError(f"EditBoundary.code must be a non-empty string, got {self.code!r}")
        if not isinstance(self.block, str):
            raise TypeError(f"EditBoundary.block must be a string, got {type(self.block).__name__}")
        if not isinstance(self.anchor, AnchorKind):
            raise TypeError(f"EditBoundary.anchor must be an AnchorKind, got {self.anchor!r}")
        if not isinstance(self.default_on, bool):
            raise TypeError(f"EditBoundary.default_on must be a bool, got {self.default_on!r}")
        _check_version(self.since, "EditBoundary.since")
        _check_version(self.until, "EditBoundary.until")
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ValueError(f"EditBoundary {self.code}: since {self.since} must be before until {self.until}")

    def applies(self, version: Version | None) -> bool:
        """Whether the edit exists at harness ``version`` (an unknown version, None → True).

        Raises:
            TypeError: ``version`` is not None or a tuple of non-negative ints.
        """
        _check_version(version, "version")
        if version is None:
            return True
        if self.since is not None and version < self.since:
            return False
        return self.until is None or version < self.until


# Boundaries every harness has (harnesses.md §0).
B0 = EditBoundary("B0", "the just-generated assistant turn, re-sent as JSON and re-rendered",
                  AnchorKind.GENERATION_START, True)
B1 = EditBoundary("B1", "earlier reasoning dropped by the chat template on a new user query "
                  "(first changed token 3 tokens after the turn start)", AnchorKind.TURN_START, True)
COMMON_BOUNDARIES = (B0, B1)


class HarnessAdapter(ABC):
    """Knowledge about one agent harness (see the module docstring).

    Subclasses set ``name``, ``title`` and ``boundaries`` and implement :meth:`detect`; the
    defaults here are those of a harness that sends no version, no session id, needs no
    normalisation and never edits its history.

    Attributes:
        name: canonical name (``"claude_code"``, ``"opencode"``, ``"openclaw"``, ``"swe_agent"``,
            ``"mini_swe_agent"``, ``"codex"``, ``"generic"``).
        title: display name (``"Claude Code"``...).
        boundaries: every known edit boundary, version-gated through ``since``/``until``.
    """

    name: ClassVar[str]
    title: ClassVar[str]
    boundaries: ClassVar[tuple[EditBoundary, ...]]

    @abstractmethod
    def detect(self, info: RequestInfo) -> float:
        """Confidence in [0, 1] that ``info`` comes from this harness (0: not this harness).
        Never raises on odd body shapes."""

    def version(self, info: RequestInfo) -> Version | None:
        """The harness version the request reveals (User-Agent etc.), or None."""
        return None

    def session_key(self, info: RequestInfo) -> str | None:
        """The client's own session id when it sends one, else None."""
        return None

    def edit_boundaries(self, version: Version | None = None) -> tuple[EditBoundary, ...]:
        """The boundaries that apply at harness ``version`` (None: all of them).

        Raises:
            TypeError: ``version`` is not None or a tuple of non-negative ints.
        """
        return tuple(b for b in self.boundaries if b.applies(version))

    def anchor_policy(self, version: Version | None = None) -> AnchorPolicy:
        """Checkpoint kinds for this harness: turn_start, generation_start, generation_end plus
        the anchor of every default-on boundary that applies at ``version``.

        Raises:
            TypeError: ``version`` is not None or a tuple of non-negative ints.
        """
        extra = {b.anchor for b in self.edit_boundaries(version) if b.default_on}
        return AnchorPolicy(BASE_ANCHORS | frozenset(extra))

    def normalize(self, messages: list[dict]) -> list[dict]:
        """Template-form messages with this harness's per-request prefix busters removed,
        meaning unchanged. Returns ``messages`` itself when there is nothing to remove, else a
        new list sharing every unchanged message; the input is never modified.

        Raises:
            TypeError: ``messages`` is not a list.
        """
        if not isinstance(messages, list):
            raise TypeError(f"messages must be a list, got {type(messages).__name__}")
        return messages

    def simulate_edits(self, messages: list[dict], **options: Any) -> list[dict]:
        """The history this harness would send on its next request (pure; a new list, input
        untouched). The default is append-only: a copy of the list.

        Raises:
            TypeError: ``messages`` is not a list of dicts, or an unknown option.
        """
        if options:
            raise TypeError(f"{self.name} simulate_edits takes no options, got {sorted(options)}")
        check_messages(messages)
        return list(messages)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
