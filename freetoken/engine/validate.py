"""Checks a :class:`GenerationRequest` before it is queued; bad input gets a clear ValueError."""

from __future__ import annotations

import math

from freetoken.core import EngineInfo, GenerationRequest


class ContextLengthError(ValueError):
    """The prompt is empty or leaves no room for one output token (OpenAI
    ``context_length_exceeded``)."""


def validate_request(request: GenerationRequest, info: EngineInfo) -> None:
    """Raise if ``request`` cannot run on the model described by ``info``.

    Raises:
        ContextLengthError: empty prompt, or ``len(prompt) + 1 > info.max_model_len``.
        ValueError: a prompt or stop token id outside ``[0, info.vocab_size)``, or a sampling
            parameter out of range (``max_tokens < 1``, negative or non-finite
            ``temperature``, ``top_p`` outside (0, 1], negative ``top_k`` or ``logprobs``,
            an empty stop string, a ``logit_bias`` id outside the vocabulary or bias outside
            [-100, 100]).
    """
    n = len(request.prompt_ids)
    if n == 0:
        raise ContextLengthError("The prompt is empty: at least one prompt token is required.")
    if n + 1 > info.max_model_len:
        raise ContextLengthError(
            f"This model's maximum context length is {info.max_model_len} tokens, but the prompt "
            f"has {n} tokens and at least 1 token must be left for the output. "
            "Please reduce the length of the prompt."
        )
    vocab = info.vocab_size
    for pos, token in enumerate(request.prompt_ids):
        if not 0 <= token < vocab:
            raise ValueError(
                f"prompt token id {token} at position {pos} is outside the vocabulary [0, {vocab})"
            )
    sp = request.sampling
    if sp.max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {sp.max_tokens}")
    if not math.isfinite(sp.temperature) or sp.temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0, got {sp.temperature}")
    if not 0 < sp.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {sp.top_p}")
    if sp.top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 disables it), got {sp.top_k}")
    if sp.logprobs is not None and sp.logprobs < 0:
        raise ValueError(f"logprobs must be >= 0, got {sp.logprobs}")
    if any(not isinstance(s, str) or not s for s in sp.stop):
        raise ValueError(f"stop strings must be non-empty strings, got {list(sp.stop)!r}")
    for token in sp.stop_token_ids:
        if not 0 <= token < vocab:
            raise ValueError(f"stop token id {token} is outside the vocabulary [0, {vocab})")
    for token, bias in sp.logit_bias:
        if not 0 <= token < vocab:
            raise ValueError(f"logit_bias token id {token} is outside the vocabulary [0, {vocab})")
        if not -100 <= bias <= 100:
            raise ValueError(f"logit_bias of token {token} must be in [-100, 100], got {bias}")
