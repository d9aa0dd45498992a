"""The two objects that cross the scheduler / model-runner boundary.

Each engine step is ``schedule -> execute -> update`` (vLLM v1 ``EngineCore.step``): the
scheduler emits a :class:`ScheduledBatch`, the runner returns a :class:`ForwardOutput`, and
nothing else passes between them. Token accounting is unified (vLLM's scheduler note): a
request has ``num_computed_tokens`` of its ``prompt + output`` ids in the model state, and a
step grants the next slice of not-yet-computed ids, so a prefill chunk and a decode step are
the same thing with different lengths. The batch holds one request for now; continuous
batching will turn the per-request fields into per-request entries.
"""

from __future__ import annotations

from dataclasses import dataclass

from freetoken.core import SamplingParams


@dataclass(frozen=True)
class ScheduledBatch:
    """Work for one engine step.

    Attributes:
        request_key: engine-internal id of the request (unique even when request ids repeat).
        token_ids: the ids to feed, ``[T]`` with T >= 1 (a prefill chunk, or the last sampled
            token when decoding).
        num_computed_tokens: ids of this request already in the model state; ``0`` means the
            runner must create a fresh state (and generator) first.
        sample: True when ``token_ids`` reaches the end of the known ids, so the runner must
            sample the next token; False for a non-final prefill chunk.
        sampling: the request's sampling parameters.
    """

    request_key: int
    token_ids: tuple[int, ...]
    num_computed_tokens: int
    sample: bool
    sampling: SamplingParams


@dataclass(frozen=True)
class ForwardOutput:
    """Result of executing a :class:`ScheduledBatch`.

    Attributes:
        request_key: the request it belongs to.
        token_id: the sampled token, or None for a non-final prefill chunk or on error.
        logprob: raw logprob of ``token_id`` when logprobs were requested.
        top_logprobs: the top ``(token_id, logprob)`` alternatives when requested.
        error: a message when the forward pass or sampling raised (the runner has already
            dropped the request's state); None on success.
    """

    request_key: int
    token_id: int | None = None
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()
    error: str | None = None
