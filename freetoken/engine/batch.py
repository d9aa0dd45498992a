"""The two objects that cross the scheduler / model-runner boundary.

Each engine step is ``schedule -> execute -> update`` (vLLM v1 ``EngineCore.step``): the
scheduler emits a :class:`ScheduledBatch`, the runner returns one :class:`ForwardOutput` per
entry, and nothing else passes between them. Token accounting is unified (vLLM's scheduler
note): a request has ``num_computed_tokens`` of its ``prompt + output`` ids in the model state,
and a step grants the next slice of not-yet-computed ids, so a prefill chunk and a decode step
are the same thing with different lengths. A batch holds one :class:`SeqWork` per scheduled
request (continuous batching: decode steps of every running request plus prefill chunks under
the token budget). The KV pages and recurrent-state checkpoints the entries name live in shared
pools (``freetoken.prefix``); the batch carries only their ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from freetoken.core import SamplingParams


@dataclass(frozen=True)
class SeqWork:
    """One request's share of a step.

    Attributes:
        request_key: engine-internal id of the request (unique even when request ids repeat).
        token_ids: the ids to feed, ``[T]`` with T >= 1 (a prefill chunk, or the last sampled
            token when decoding).
        num_computed_tokens: ids of this request already in the model state (the position of
            ``token_ids[0]``).
        sample: True when ``token_ids`` reaches the end of the known ids, so the runner must
            sample the next token; False for a non-final prefill chunk (or a commit step).
        sampling: the request's sampling parameters.
        new_state: True when the runner must build the request's state first (its first entry,
            or after a preemption): empty when ``num_computed_tokens == 0``, else restored from
            ``prefix_slots`` (attention KV) and ``restore_checkpoint`` (recurrent state).
        prefix_slots: KV token slots of positions ``[0, num_computed_tokens)`` (reused prefix),
            only with ``new_state`` on a paged model.
        restore_checkpoint: recurrent-state checkpoint id to load, or None.
        slots: KV token slots for ``token_ids`` (paged models; empty otherwise).
        capture: positions ``p`` (``num_computed_tokens < p <= num_computed_tokens + T``) where
            the recurrent state is snapshotted for a checkpoint (anchors inside the chunk).
        decode: True when ``token_ids`` are fed-back sampled tokens (decode phase), False for
            prompt ids (prefill phase).
    """

    request_key: int
    token_ids: tuple[int, ...]
    num_computed_tokens: int
    sample: bool
    sampling: SamplingParams
    new_state: bool = False
    prefix_slots: tuple[int, ...] = ()
    restore_checkpoint: int | None = None
    slots: tuple[int, ...] = ()
    capture: tuple[int, ...] = ()
    decode: bool = False


@dataclass(frozen=True)
class ScheduledBatch:
    """Work for one engine step: one entry per scheduled request (at least one)."""

    entries: tuple[SeqWork, ...]

    @property
    def num_tokens(self) -> int:
        """Ids fed in this step (all entries)."""
        return sum(len(e.token_ids) for e in self.entries)


@dataclass(frozen=True)
class ForwardOutput:
    """Result of executing one :class:`SeqWork`.

    Attributes:
        request_key: the request it belongs to.
        token_id: the sampled token, or None for a non-final prefill chunk or on error.
        logprob: raw logprob of ``token_id`` when logprobs were requested.
        top_logprobs: the top ``(token_id, logprob)`` alternatives when requested.
        error: a message when the forward pass or sampling raised (the runner has already
            dropped the request's state); None on success.
        snapshots: ``(position, state tensors)`` for each captured position of the entry
            (copies, in ``DecoderLM.recurrent_tensors`` order).
    """

    request_key: int
    token_id: int | None = None
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()
    error: str | None = None
    snapshots: tuple[tuple[int, tuple[Any, ...]], ...] = ()
