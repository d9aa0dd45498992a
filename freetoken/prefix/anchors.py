"""Anchors: prompt positions where a recurrent-state checkpoint is worth taking.

A hybrid model (Gated DeltaNet + attention) can reuse the KV cache of any shared prefix, but its
recurrent state only where a checkpoint was saved. Checkpoints placed at block boundaries of the
chat format (turn starts, think blocks, tool calls, tool outputs, generation start/end) land where
the next request of an agent loop diverges from the previous one (checkpoint-policy-sim.md, policies
P3/P4; paper §3.1). The boundary is the position OF the marker token: the checkpoint holds the state
after consuming ``ids[:position]``, so a request that rewrites the block can still reuse it.

Markers follow the Qwen3 chat format (ChatML ``<|im_start|>``, ``<think>``, ``<tool_call>``,
``<tool_response>``; model-architectures.md §7.3), as used by the project's tokenizer
(freetoken/tokenizer/train.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from enum import Enum

import numpy as np


class AnchorKind(str, Enum):
    """Kind of block boundary an anchor marks (the value is the name used by ``AnchorPolicy.parse``)."""

    TURN_START = "turn_start"
    THINKING_START = "thinking_start"
    TOOL_CALL_START = "tool_call_start"
    TOOL_OUTPUT_START = "tool_output_start"
    GENERATION_START = "generation_start"
    GENERATION_END = "generation_end"


# Kinds found from marker tokens inside the prompt, in the order used to break ties when one token
# id is a marker of several kinds (the first kind listed wins).
_MARKER_KINDS = (
    AnchorKind.TURN_START,
    AnchorKind.THINKING_START,
    AnchorKind.TOOL_CALL_START,
    AnchorKind.TOOL_OUTPUT_START,
)
_DEFAULT_KINDS = frozenset({AnchorKind.TURN_START, AnchorKind.GENERATION_START, AnchorKind.GENERATION_END})
_POLICY_WORDS = ("all", "default", "none")


@dataclass(frozen=True)
class Anchor:
    """A checkpoint position in a token sequence.

    Attributes:
        position: number of tokens consumed; the checkpoint is the recurrent state after
            ``ids[:position]`` (for a marker kind, the index of the marker token itself).
        kind: which boundary it marks.
    """

    position: int
    kind: AnchorKind


@dataclass(frozen=True)
class AnchorPolicy:
    """Which anchor kinds get a checkpoint.

    Attributes:
        kinds: the enabled kinds.

    Raises:
        TypeError: ``kinds`` holds something other than ``AnchorKind`` members.
    """

    kinds: frozenset[AnchorKind]

    def __post_init__(self) -> None:
        if not isinstance(self.kinds, frozenset) or not all(isinstance(k, AnchorKind) for k in self.kinds):
            raise TypeError(f"AnchorPolicy.kinds must be a frozenset of AnchorKind, got {self.kinds!r}")

    @classmethod
    def default(cls) -> "AnchorPolicy":
        """Turn starts + generation start + generation end (P3 of checkpoint-policy-sim.md plus the
        generation-end checkpoint that closed the remaining gap on the Claude Code traces)."""
        return cls(_DEFAULT_KINDS)

    @classmethod
    def all(cls) -> "AnchorPolicy":
        """Every kind (P4 semantic anchors + generation end)."""
        return cls(frozenset(AnchorKind))

    @classmethod
    def none(cls) -> "AnchorPolicy":
        """No anchors (only the live state is reused)."""
        return cls(frozenset())

    @classmethod
    def parse(cls, text: str) -> "AnchorPolicy":
        """Policy from a comma-separated list of kind names (``"turn_start,generation_start"``).

        The single words ``all``, ``default`` and ``none`` (or an empty string) name the presets.
        Names are case-insensitive; surrounding spaces are ignored.

        Raises:
            TypeError: ``text`` is not a string.
            ValueError: an unknown or empty name; the message lists the valid kinds.
        """
        if not isinstance(text, str):
            raise TypeError(f"anchor policy must be a string, got {type(text).__name__}")
        words = text.strip().lower()
        if words in ("", "none"):
            return cls.none()
        if words == "all":
            return cls.all()
        if words == "default":
            return cls.default()
        kinds = set()
        for part in words.split(","):
            name = part.strip()
            try:
                kinds.add(AnchorKind(name))
            except ValueError:
                valid = ", ".join(k.value for k in AnchorKind)
                raise ValueError(
                    f"unknown anchor kind {name!r} in {text!r}; valid kinds: {valid} "
                    f"(or one of {', '.join(_POLICY_WORDS)})"
                ) from None
        return cls(frozenset(kinds))

    def __str__(self) -> str:
        return ",".join(k.value for k in AnchorKind if k in self.kinds) or "none"


@dataclass(frozen=True)
class AnchorMarkers:
    """Token ids that open a block, for one tokenizer.

    Attributes:
        turn_start: ids opening a chat turn (``<|im_start|>``).
        thinking_start: ids opening a think block (``<think>``).
        tool_call_start: ids opening a tool call (``<tool_call>``).
        tool_output_start: ids opening a tool output (``<tool_response>``).

    Raises:
        TypeError: a field is not a frozenset of non-negative ints.
    """

    turn_start: frozenset[int] = frozenset()
    thinking_start: frozenset[int] = frozenset()
    tool_call_start: frozenset[int] = frozenset()
    tool_output_start: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        for f in fields(self):
            ids = getattr(self, f.name)
            if not isinstance(ids, frozenset) or not all(
                isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids
            ):
                raise TypeError(f"AnchorMarkers.{f.name} must be a frozenset of token ids, got {ids!r}")

    @classmethod
    def empty(cls) -> "AnchorMarkers":
        """No marker ids (only generation anchors can be placed)."""
        return cls()

    @classmethod
    def from_tokenizer(cls, tok) -> "AnchorMarkers":
        """Markers of the Qwen3 chat format in ``tok``'s vocabulary.

        Args:
            tok: a ``freetoken.tokenizer.tokenizer.Tokenizer`` (its ``.hf`` is used) or any object
                with ``token_to_id(str) -> int | None`` (a ``tokenizers.Tokenizer``).

        A marker absent from the vocabulary is left out (its set is empty).

        Raises:
            TypeError: ``tok`` has no ``token_to_id``.
        """
        vocab = getattr(tok, "hf", tok)
        lookup = getattr(vocab, "token_to_id", None)
        if not callable(lookup):
            raise TypeError(f"from_tokenizer needs a tokenizer with token_to_id, got {type(tok).__name__}")

        def ids(*names: str) -> frozenset[int]:
            return frozenset(i for i in (lookup(n) for n in names) if i is not None)

        return cls(
            turn_start=ids("<|im_start|>"),
            thinking_start=ids("<think>"),
            tool_call_start=ids("<tool_call>"),
            tool_output_start=ids("<tool_response>"),
        )

    def ids_of(self, kind: AnchorKind) -> frozenset[int]:
        """Marker ids of ``kind`` (empty for GENERATION_START/END, which have no marker token)."""
        return getattr(self, kind.value) if kind in _MARKER_KINDS else frozenset()


def find_anchors(prompt_ids: Sequence[int], markers: AnchorMarkers,
                 policy: AnchorPolicy) -> tuple[Anchor, ...]:
    """Anchors of a prompt under ``policy``.

    Each occurrence of a marker token of an enabled kind at index ``i > 0`` gives
    ``Anchor(i, kind)`` (the state before the marker). ``GENERATION_START`` (when enabled and the
    prompt is not empty) is ``len(prompt_ids)``. ``GENERATION_END`` is not placed here: the engine
    adds it at prompt + output length.

    Args:
        prompt_ids: ``[n]`` token ids (list, tuple, int numpy array or CPU int tensor).
        markers: marker ids of the tokenizer.
        policy: enabled kinds.

    Returns:
        Anchors sorted by position, one per position (a token that is a marker of several kinds
        gets the first of turn_start, thinking_start, tool_call_start, tool_output_start).

    Raises:
        ValueError: ``prompt_ids`` is not one-dimensional or not integers.
    """
    ids = np.asarray(prompt_ids)
    if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
        raise ValueError(
            f"prompt_ids must be a 1-D sequence of token ids, got shape {ids.shape} dtype {ids.dtype}")
    found: dict[int, AnchorKind] = {}
    for kind in _MARKER_KINDS:
        marker_ids = markers.ids_of(kind)
        if kind not in policy.kinds or not marker_ids or ids.size == 0:
            continue
        for pos in np.flatnonzero(np.isin(ids, np.fromiter(marker_ids, dtype=np.int64))).tolist():
            if pos > 0:
                found.setdefault(pos, kind)
    if AnchorKind.GENERATION_START in policy.kinds and ids.size:
        found[int(ids.size)] = AnchorKind.GENERATION_START
    return tuple(Anchor(pos, found[pos]) for pos in sorted(found))
