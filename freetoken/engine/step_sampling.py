"""A step's sampling: the entries that sample, their logits rows, bias and grammar, one call.

Between the model's ``[B, V]`` logits and the runner's outputs: selects the rows whose entry
samples, cuts them to the sampleable vocabulary, adds the live logit biases (the raw rows stay
for logprobs), asks each grammar-constrained request's matcher which ids it allows, samples all
rows with one :func:`~freetoken.engine.batch_sampler.sample_batch` call and feeds each
constrained request's token back to its matcher. A grammar failure ends that request alone.

Shapes: B = entries of the step, R = entries that sample, V = sampleable vocabulary size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from freetoken.constrain.spec import GrammarError
from freetoken.engine.batch import SeqWork
from freetoken.engine.batch_sampler import sample_batch
from freetoken.engine.logit_bias import LogitBiases
from freetoken.engine.sampler import SampledToken
from freetoken.engine.sampling_rows import SamplingRows


@dataclass(frozen=True)
class GrammarFailed:
    """A grammar-constrained entry whose grammar failed this step; its request ends with
    ``message`` (the other entries of the step go on)."""

    message: str


def sample_entries(entries: Sequence[SeqWork], generators: Sequence[torch.Generator],
                   logits: torch.Tensor, biases: LogitBiases, constraints: Mapping[int, object],
                   sampleable_vocab: int | None) -> dict[int, SampledToken | GrammarFailed]:
    """Sample every entry that asks for it.

    Args:
        entries: the step's entries, one per row of ``logits``.
        generators: each entry's request generator, in entry order.
        logits: ``[B, V_model]`` model logits.
        biases: the live requests' logit biases.
        constraints: request key -> ``freetoken.constrain.matcher.ToolCallMatcher``.
        sampleable_vocab: ids the tokenizer can decode (columns past it are never sampled), or
            None for every column.

    Returns:
        By entry row: the sampled token, or the grammar failure that ends that request.
        Entries that do not sample have no key.
    """
    rows = [row for row, work in enumerate(entries) if work.sample]
    if not rows:
        return {}
    vocab = logits.shape[-1]
    if sampleable_vocab is not None:
        vocab = min(vocab, sampleable_vocab)
    matchers = {}
    if constraints:
        matchers = {row: m for row in rows
                    if (m := constraints.get(entries[row].request_key)) is not None}
    picked: dict[int, SampledToken | GrammarFailed] = {}
    masks: dict[int, torch.Tensor] = {}
    for row, matcher in matchers.items():
        try:
            masks[row] = matcher.allowed(vocab, logits.device)  # [V] bool
        except GrammarError as exc:
            picked[row] = GrammarFailed(str(exc))
    rows = [row for row in rows if row not in picked]
    if not rows:
        return picked
    raw = _select(logits, rows, vocab)  # [R, V]
    pick = raw
    if biases:
        biased = biases.apply(logits, [w.request_key if w.sample else None for w in entries])
        if biased is not logits:
            pick = _select(biased, rows, vocab)  # [R, V] float32
    allowed = None
    if masks:
        allowed = torch.ones(len(rows), vocab, dtype=torch.bool, device=logits.device)  # [R, V]
        for i, row in enumerate(rows):
            if row in masks:
                allowed[i] = masks[row]
    params = SamplingRows.build([entries[row].sampling for row in rows],
                                [generators[row] for row in rows], vocab, logits.device)
    tokens = sample_batch(pick, params, allowed, raw_logits=None if pick is raw else raw)
    for row, token in zip(rows, tokens):
        picked[row] = token
        matcher = matchers.get(row)
        if matcher is None:
            continue
        try:  # the grammar follows the token it allowed
            matcher.advance(token.token_id)
        except GrammarError as exc:
            picked[row] = GrammarFailed(str(exc))
    return picked


def _select(logits: torch.Tensor, rows: list[int], vocab: int) -> torch.Tensor:
    """``[R, vocab]``: the listed rows' first ``vocab`` columns (``logits`` itself when that is
    all of it; otherwise a contiguous copy, so each row is laid out as the per-row path's)."""
    every_row = len(rows) == logits.shape[0]
    if every_row and vocab == logits.shape[-1]:
        return logits
    if every_row:
        return logits[:, :vocab].contiguous()
    return logits[torch.tensor(rows, device=logits.device), :vocab]
