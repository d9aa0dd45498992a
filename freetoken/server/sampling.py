"""Builds :class:`freetoken.core.SamplingParams` from request fields and the server's limits."""

from __future__ import annotations

from freetoken.core import SamplingParams
from freetoken.server.config import ServerConfig
from freetoken.server.errors import bad_request


def stop_strings(stop: str | list[str] | None, param: str) -> tuple[str, ...]:
    """Stop strings as a tuple (a single string becomes one entry).

    Raises:
        APIError: 400 for an empty stop string.
    """
    items = [stop] if isinstance(stop, str) else list(stop or [])
    for i, item in enumerate(items):
        if not item:
            name = param if isinstance(stop, str) else f"{param}.{i}"
            raise bad_request(f"{name}: stop strings must be non-empty", param=name)
    return tuple(items)


MAX_LOGIT_BIAS = 100.0


def parse_logit_bias(
    raw: dict[str, float] | None, vocab_size: int
) -> tuple[tuple[int, float], ...]:
    """OpenAI ``logit_bias`` (token id as a string → bias) as ``(id, bias)`` pairs sorted by id.
    ``vocab_size`` is the tokenizer's: the model's padded rows beyond it are never sampled.

    Raises:
        APIError: 400 (``param: "logit_bias"``) for a key that is not a non-negative integer, an
            id outside ``[0, vocab_size)``, or a bias outside [-100, 100] (or not finite).
    """
    pairs = []
    for key, value in (raw or {}).items():
        bias = float(value)
        if not key.isascii() or not key.isdigit():
            raise bad_request(
                f"Invalid key in 'logit_bias': {key}. You should only be submitting non-negative "
                "integers.", param="logit_bias")
        token = int(key)
        if token >= vocab_size:
            raise bad_request(
                f"Invalid key in 'logit_bias': {token}. Token ids must be below the vocabulary "
                f"size {vocab_size}.", param="logit_bias")
        if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
            raise bad_request(
                f"Invalid value in 'logit_bias' for token {token}: {bias}. Bias values must be "
                "between -100 and 100.", param="logit_bias")
        pairs.append((token, float(bias)))
    return tuple(sorted(pairs))


def build_sampling(
    *,
    config: ServerConfig,
    requested_max_tokens: int | None,
    prompt_len: int,
    max_model_len: int,
    temperature: float | None,
    top_p: float | None,
    top_k: int | None,
    seed: int | None,
    stop: tuple[str, ...],
    ignore_eos: bool,
    logprobs: int | None = None,
    logit_bias: tuple[tuple[int, float], ...] = (),
) -> SamplingParams:
    """Sampling parameters with the output limit clamped.

    ``max_tokens = min(requested or default, config.max_output_tokens, max_model_len -
    prompt_len)``; ``length_capped`` is True when that is below what the request itself asked
    for. Defaults follow both APIs: temperature 1.0, top_p 1.0, top_k off (``-1`` also means off,
    as in vLLM).

    Args:
        prompt_len: prompt tokens (already checked to leave room for one output token).
        logit_bias: already checked pairs (:func:`parse_logit_bias`).
    """
    limit = requested_max_tokens if requested_max_tokens is not None else config.fallback_max_tokens
    max_tokens = max(1, min(limit, config.max_output_tokens, max_model_len - prompt_len))
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        top_k=0 if top_k is None or top_k < 0 else top_k,
        seed=seed,
        stop=stop,
        ignore_eos=ignore_eos,
        logprobs=logprobs,
        logit_bias=logit_bias,
        length_capped=requested_max_tokens is not None and max_tokens < requested_max_tokens,
    )
