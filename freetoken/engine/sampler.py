"""Next-token sampling of one row: the reference the batched sampler reproduces.

The engine samples a whole step at once with :func:`freetoken.engine.batch_sampler.sample_batch`,
which returns, row for row, exactly what :func:`sample` returns here for the same logits,
parameters and generator state (the tests compare the two). This module stays the readable
definition of the semantics, and holds what both share (:class:`SampledToken`,
:func:`make_generator`, :data:`GREEDY_TEMPERATURE`).

Order of operations follows the HF ``generate`` logits-warper chain and vLLM's sampler:
temperature scaling, then top-k, then top-p (nucleus, Holtzman et al. 2019, §3.1) on the
renormalised top-k distribution, then one draw from a per-request ``torch.Generator``.
Logprobs are always taken from the *raw* logits (``log_softmax`` before temperature and
filtering), as the OpenAI API and vLLM's default ``raw_logprobs`` mode report them.

Shapes: V = vocabulary size. Every function works on one sequence's ``[V]`` float32 logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from freetoken.core import SamplingParams

GREEDY_TEMPERATURE = 1e-5
"""Temperatures below this sample greedily (vLLM's ``_SAMPLING_EPS``): dividing logits by a
tinier temperature can overflow float32 to ``inf`` and the softmax to NaN (a 500 for what is a
valid request), and at such temperatures sampling is argmax except between near-tied logits."""


@dataclass(frozen=True)
class SampledToken:
    """One sampled token and, when requested, its raw logprobs.

    Attributes:
        token_id: the chosen token id.
        logprob: natural-log probability of ``token_id`` under the raw logits, or None when
            logprobs were not requested.
        top: the ``n`` most likely ``(token_id, logprob)`` pairs under the raw logits, most
            likely first (empty when not requested or ``n == 0``).
    """

    token_id: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A per-request random generator on ``device``.

    Args:
        seed: fixed seed (any int; reduced modulo 2**64) so the same request reproduces exactly,
            or None for a fresh non-deterministic seed.
        device: where sampling runs (the logits' device).
    """
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed % (1 << 64))
    return gen


def apply_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep exactly the ``k`` largest logits and set the rest to ``-inf``.

    Args:
        logits: ``[V]`` float logits.
        k: number of tokens to keep; ``0`` or ``k >= V`` disables the filter.

    Returns:
        ``[V]`` logits (a new tensor when filtered, else ``logits`` itself). Ties at the k-th
        value are broken by ``torch.topk`` order, so exactly k entries stay finite.
    """
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    idx = torch.topk(logits, k).indices  # [k]
    out = torch.full_like(logits, float("-inf"))
    return out.scatter(-1, idx, logits.gather(-1, idx))


def apply_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability mass is at least ``p``.

    A token is kept when the mass of the tokens ranked strictly above it is below ``p``, so
    the kept set is the shortest prefix of the descending-probability order reaching ``p``;
    the most likely token is always kept.

    Args:
        logits: ``[V]`` float logits (already temperature-scaled / top-k filtered).
        p: nucleus mass in (0, 1]; ``1.0`` disables the filter.

    Returns:
        ``[V]`` logits with the dropped tokens set to ``-inf``.
    """
    if p >= 1.0:
        return logits
    probs = torch.softmax(logits, dim=-1)  # [V]
    sorted_probs, order = torch.sort(probs, descending=True)  # [V], [V]
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # [V]
    drop_sorted = mass_before >= p
    drop_sorted[0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # back to vocab order
    return logits.masked_fill(drop, float("-inf"))


def sample(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None,
    allowed: torch.Tensor | None = None, raw_logits: torch.Tensor | None = None,
) -> SampledToken:
    """Pick the next token from one position's logits.

    Greedy (argmax, lowest id on ties) when ``params.temperature`` is below
    :data:`GREEDY_TEMPERATURE` (0 included); otherwise divide by the temperature, apply top-k
    then top-p, and draw with ``torch.multinomial`` using ``generator``.

    Args:
        logits: ``[V]`` or ``[1, V]`` float logits of the last position (any float dtype; the
            math runs in float32).
        params: temperature / top_k / top_p / logprobs of the request.
        generator: the request's generator (needed unless greedy), on ``logits.device``.
        allowed: ``[V]`` bool, the only ids that may be picked (grammar-constrained decoding,
            ``freetoken.constrain``): the others' logits are set to ``-inf`` before the
            temperature / top-k / top-p chain; logprobs stay those of the raw logits.
        raw_logits: ``[V]`` logits the logprobs are taken from when ``logits`` were already
            changed (``logit_bias``); None takes them from ``logits``.

    Returns:
        The sampled token with raw logprobs when ``params.logprobs`` is not None.

    Raises:
        ValueError: logits are not ``[V]``/``[1, V]``, or sampling is requested without a
            generator.
    """
    if logits.dim() == 2 and logits.shape[0] == 1:
        logits = logits[0]
    if logits.dim() != 1:
        raise ValueError(f"expected [V] or [1, V] logits, got shape {tuple(logits.shape)}")
    logits = logits.float()
    raw = logits if raw_logits is None else raw_logits.reshape(-1).float()
    pick = logits if allowed is None else logits.masked_fill(~allowed, float("-inf"))
    if params.temperature < GREEDY_TEMPERATURE:
        token = int(torch.argmax(pick).item())
    else:
        if generator is None:
            raise ValueError("sampling with temperature > 0 needs a torch.Generator")
        scaled = apply_top_p(apply_top_k(pick / params.temperature, params.top_k), params.top_p)
        probs = torch.softmax(scaled, dim=-1)  # [V]
        token = int(torch.multinomial(probs, 1, generator=generator).item())
    if params.logprobs is None:
        return SampledToken(token)
    logprobs = torch.log_softmax(raw, dim=-1)  # [V]
    top: tuple[tuple[int, float], ...] = ()
    n = min(params.logprobs, logprobs.shape[-1])
    if n > 0:
        values, ids = torch.topk(logprobs, n)
        top = tuple(zip(ids.tolist(), values.tolist()))
    return SampledToken(token, float(logprobs[token].item()), top)
