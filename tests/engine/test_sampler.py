"""Sampling: greedy, top-k, top-p, temperature order, seeded reproducibility, raw logprobs."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from freetoken.core import SamplingParams
from freetoken.engine.sampler import apply_top_k, apply_top_p, make_generator, sample

# A hand-made distribution, deliberately not sorted by id.
PROBS = {3: 0.5, 0: 0.2, 4: 0.15, 1: 0.1, 2: 0.05}
LOGITS = torch.tensor([math.log(PROBS[i]) for i in range(5)])


def _draws(logits: torch.Tensor, params: SamplingParams, n: int, seed: int = 0) -> list[int]:
    gen = make_generator(seed)
    return [sample(logits, params, gen).token_id for _ in range(n)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_is_argmax(seed: int) -> None:
    logits = torch.randn(1, 1000, generator=torch.Generator().manual_seed(seed))
    params = SamplingParams(temperature=0.0, top_k=5, top_p=0.1)
    assert sample(logits, params, None).token_id == int(logits.argmax())


def test_greedy_tie_takes_lowest_id() -> None:
    assert sample(torch.tensor([0.0, 2.0, 2.0, 1.0]), SamplingParams(temperature=0), None).token_id == 1


@pytest.mark.parametrize(
    ("p", "kept"),
    [(0.3, {3}), (0.5, {3}), (0.6, {3, 0}), (0.75, {3, 0, 4}), (0.86, {3, 0, 4, 1}), (1.0, {0, 1, 2, 3, 4})],
)
def test_top_p_keeps_smallest_set_reaching_p(p: float, kept: set[int]) -> None:
    out = apply_top_p(LOGITS, p)
    assert {i for i in range(5) if math.isfinite(out[i])} == kept
    for i in kept:  # kept logits are untouched
        assert out[i] == LOGITS[i]


def test_top_k_keeps_exactly_k_even_with_ties() -> None:
    logits = torch.tensor([1.0, 3.0, 3.0, 3.0, 0.5])
    out = apply_top_k(logits, 2)
    assert torch.isfinite(out).sum() == 2
    assert set(torch.nonzero(torch.isfinite(out)).flatten().tolist()) <= {1, 2, 3}
    assert apply_top_k(LOGITS, 3).isfinite().tolist() == [True, False, False, True, True]
    assert apply_top_k(LOGITS, 0) is LOGITS and apply_top_k(LOGITS, 5) is LOGITS


def test_top_p_sampling_frequencies_match_renormalised_nucleus() -> None:
    counts = Counter(_draws(LOGITS, SamplingParams(temperature=1.0, top_p=0.75), 4000))
    assert set(counts) == {3, 0, 4}
    mass = 0.5 + 0.2 + 0.15
    for tok in (3, 0, 4):
        assert abs(counts[tok] / 4000 - PROBS[tok] / mass) < 0.03


def test_top_k_is_applied_before_top_p() -> None:
    # probs 0.4/0.3/0.2/0.1: top_k=2 renormalises to 0.571/0.429, so top_p=0.5 keeps token 0
    # only; applied the other way round both tokens 0 and 1 would be sampled.
    logits = torch.tensor([0.4, 0.3, 0.2, 0.1]).log()
    assert set(_draws(logits, SamplingParams(temperature=1.0, top_k=2, top_p=0.5), 300)) == {0}


def test_temperature_is_applied_before_top_p() -> None:
    # T=0.25 sharpens 0.4/0.3/0.2/0.1 to 0.723/0.229/0.045/0.003, so top_p=0.8 keeps {0, 1};
    # top-p on the unscaled distribution would keep token 2 too (~4.5% of draws).
    logits = torch.tensor([0.4, 0.3, 0.2, 0.1]).log()
    counts = Counter(_draws(logits, SamplingParams(temperature=0.25, top_p=0.8), 2000))
    assert set(counts) == {0, 1}
    assert abs(counts[0] / 2000 - 0.723 / 0.952) < 0.03


def test_temperature_matches_reference_draws_exactly() -> None:
    logits = torch.randn(50, generator=torch.Generator().manual_seed(7))
    params = SamplingParams(temperature=0.7, top_k=10)
    ref_logits = logits / 0.7
    keep = torch.topk(ref_logits, 10).indices
    ref_probs = torch.zeros(50)
    ref_probs[keep] = torch.softmax(ref_logits[keep], dim=-1)
    gen = make_generator(123)
    expected = [int(torch.multinomial(ref_probs, 1, generator=gen)) for _ in range(100)]
    assert _draws(logits, params, 100, seed=123) == expected


def test_seed_reproduces_and_differs_across_seeds() -> None:
    logits = torch.randn(500, generator=torch.Generator().manual_seed(3))
    params = SamplingParams(temperature=1.0)
    a, b, c = _draws(logits, params, 50, 42), _draws(logits, params, 50, 42), _draws(logits, params, 50, 43)
    assert a == b
    assert a != c
    assert make_generator(2**70 + 5).initial_seed() == 5  # large seeds wrap modulo 2**64


def test_logprobs_come_from_raw_logits() -> None:
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    raw = torch.log_softmax(logits, dim=-1)
    out = sample(logits, SamplingParams(temperature=0.5, top_k=2, logprobs=3), make_generator(0))
    assert out.logprob == pytest.approx(float(raw[out.token_id]), abs=1e-6)
    assert [i for i, _ in out.top] == [0, 1, 2]
    assert [lp for _, lp in out.top] == pytest.approx(raw[:3].tolist(), abs=1e-6)
    greedy = sample(logits, SamplingParams(temperature=0, logprobs=0), None)
    assert greedy.token_id == 0 and greedy.top == ()
    assert greedy.logprob == pytest.approx(math.log(math.exp(2) / sum(math.exp(x) for x in (2, 1, 0, -1))))
    assert sample(logits, SamplingParams(temperature=0), None).logprob is None


def test_bad_inputs_raise() -> None:
    with pytest.raises(ValueError, match=r"expected \[V\] or \[1, V\] logits, got shape \(2, 3\)"):
        sample(torch.zeros(2, 3), SamplingParams(temperature=0), None)
    with pytest.raises(ValueError, match="needs a torch.Generator"):
        sample(torch.zeros(3), SamplingParams(temperature=1.0), None)


@pytest.mark.parametrize("temperature", [1e-40, 1e-30, 1e-6])
def test_vanishing_temperature_samples_greedily(temperature: float) -> None:
    # 5.0 / 1e-40 overflows float32 to inf and softmax to NaN: multinomial used to raise, which
    # the server turned into a 500 for a valid request. Below GREEDY_TEMPERATURE it is argmax.
    logits = torch.tensor([1.0, 5.0, 2.0, 4.999])
    params = SamplingParams(temperature=temperature, logprobs=1)
    picked = sample(logits, params, make_generator(0))
    assert picked.token_id == 1
    assert picked.logprob == pytest.approx(float(torch.log_softmax(logits, -1)[1]))


def test_temperature_at_the_greedy_threshold_still_samples() -> None:
    from freetoken.engine.sampler import GREEDY_TEMPERATURE

    # Exactly at the threshold the request is sampled (finite: 1 / 1e-5 = 1e5 fits float32);
    # two tied logits are then drawn about equally often.
    logits = torch.tensor([3.0, 3.0, -100.0])
    draws = _draws(logits, SamplingParams(temperature=GREEDY_TEMPERATURE), 400)
    counts = Counter(draws)
    assert set(counts) == {0, 1} and min(counts.values()) > 120
