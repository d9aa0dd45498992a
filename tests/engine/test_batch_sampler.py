"""The batched sampler against the per-row reference: identical tokens, logprobs and generators.

Every case runs the same rows through ``sample_batch`` (one call) and through the reference
``sample`` (one call per row), each side with its own generators seeded alike, for several
steps in a row, and asserts equality: token ids, logprobs and top alternatives bit for bit, and
the generators left in the same state. Logits are rounded through bfloat16 so that ties (which
the filters and ``topk`` must break as the reference does) are common.
"""

from __future__ import annotations

import re

import pytest
import torch

from freetoken.core import SamplingParams
from freetoken.engine import batch_filters, seeded_draw
from freetoken.engine.batch_filters import (apply_top_k_rows, apply_top_p_rows,
                                            scale_by_temperature)
from freetoken.engine.batch_sampler import INVALID_PROBS, sample_batch
from freetoken.engine.sampler import apply_top_k, apply_top_p, make_generator, sample
from freetoken.engine.sampling_rows import SamplingRows

# One of each request kind; a batch of B rows cycles through them from an offset.
KINDS = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=1.0, seed=1),
    SamplingParams(temperature=0.7, top_k=20, seed=2, logprobs=3),
    SamplingParams(temperature=1.3, top_p=0.8, seed=3),
    SamplingParams(temperature=0.0, logprobs=5),
    SamplingParams(temperature=0.9, top_k=7, top_p=0.6, seed=4, logprobs=0),
    SamplingParams(temperature=1e-6, seed=5, logprobs=1),  # below the greedy threshold
    SamplingParams(temperature=0.5, top_k=20, seed=6, logprobs=3),  # shares a top-k and n
    SamplingParams(temperature=2.0, top_p=0.95, top_k=1, seed=7),
    SamplingParams(temperature=1.0, top_p=0.3, seed=8, logprobs=10_000),  # n clamps to V
]


def _logits(b: int, v: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, v, generator=g) * 4).to(torch.bfloat16).float()  # [B, V]


def _batch(b: int, offset: int) -> list[SamplingParams]:
    return [KINDS[(offset + i) % len(KINDS)] for i in range(b)]


def _generators(params: list[SamplingParams], salt: int) -> list[torch.Generator]:
    # greedy rows get seeded generators too, so that every generator's state can be compared
    return [make_generator((1000 + i if p.seed is None else p.seed) + salt)
            for i, p in enumerate(params)]


def _compare(logits: torch.Tensor, params: list[SamplingParams], steps: int = 3,
             raw: torch.Tensor | None = None, allowed: torch.Tensor | None = None) -> None:
    v = logits.shape[-1]
    ref_gens, new_gens = _generators(params, 100), _generators(params, 100)
    for step in range(steps):
        rows = SamplingRows.build(params, new_gens, v, logits.device)
        before = logits.clone()
        got = sample_batch(logits, rows, allowed, raw_logits=raw)
        assert torch.equal(logits, before)  # the caller's logits are left alone
        want = [sample(logits[i], p, ref_gens[i],
                       None if allowed is None else allowed[i],
                       None if raw is None else raw[i])
                for i, p in enumerate(params)]
        assert got == want, f"step {step}"
    for a, b in zip(ref_gens, new_gens):
        assert torch.equal(a.get_state(), b.get_state())


@pytest.mark.parametrize("b", [1, 3, 7])
@pytest.mark.parametrize("v", [5, 1000, 4099])
@pytest.mark.parametrize("offset", [0, 1, 4])
def test_mixed_batches_match_the_reference(b: int, v: int, offset: int) -> None:
    _compare(_logits(b, v, seed=b * 31 + v + offset), _batch(b, offset))


@pytest.mark.parametrize("b", [1, 3])
def test_full_vocabulary_size_matches(b: int) -> None:
    _compare(_logits(b, 151_936, seed=b), _batch(b, 1), steps=2)


@pytest.mark.parametrize("b", [1, 3, 7])
def test_biased_rows_take_logprobs_from_the_raw_logits(b: int) -> None:
    raw = _logits(b, 777, seed=b)
    biased = raw.clone()
    biased[:, 5] += 100.0  # forced under greedy
    biased[:, 9] -= 3.5
    temps, ks = [0.0, 0.8, 1.0, 0.0, 1.5, 0.6, 0.0], [0, 3, 0, 0, 9, 3, 2]
    params = [SamplingParams(temperature=t, seed=i, logprobs=2, top_k=k)
              for i, (t, k) in enumerate(zip(temps, ks))][:b]
    _compare(biased, params, raw=raw)


def test_grammar_masks_restrict_each_row() -> None:
    logits = _logits(3, 301, seed=9)
    allowed = torch.ones(3, 301, dtype=torch.bool)
    allowed[0, :] = False
    allowed[0, [7, 11, 250]] = True
    allowed[2, 100:] = False
    params = [SamplingParams(temperature=0.0, logprobs=2), SamplingParams(temperature=1.0, seed=3),
              SamplingParams(temperature=0.8, top_p=0.9, seed=4, logprobs=1)]
    _compare(logits, params, allowed=allowed)


def test_uniform_logits_break_ties_as_the_reference() -> None:
    logits = torch.zeros(7, 64)
    logits[:, 10:20] = 1.0
    params = [SamplingParams(temperature=t, top_k=k, top_p=p, seed=i, logprobs=4)
              for i, (t, k, p) in enumerate([(0.0, 0, 1.0), (1.0, 5, 1.0), (1.0, 0, 0.5),
                                             (1.0, 12, 0.7), (0.5, 3, 1.0), (1.0, 0, 1.0),
                                             (0.0, 5, 0.2)])]
    _compare(logits, params)


def test_bfloat16_logits_match() -> None:
    logits = _logits(4, 513, seed=2).to(torch.bfloat16)
    _compare(logits, _batch(4, 2))


def test_per_row_multinomial_fallback_gives_the_same_tokens(monkeypatch) -> None:
    monkeypatch.setitem(seeded_draw._MATCHES, "cpu", False)
    _compare(_logits(7, 1000, seed=5), _batch(7, 3))


def test_the_exponential_race_matches_multinomial_on_cpu() -> None:
    assert seeded_draw._probe(torch.device("cpu"))


def test_one_transfer_and_no_item_per_step(monkeypatch) -> None:
    logits = _logits(7, 1000, seed=1)
    params = _batch(7, 0)
    rows = SamplingRows.build(params, _generators(params, 0), 1000, "cpu")
    seeded_draw.race_matches_multinomial(torch.device("cpu"))  # the one-time probe, outside
    calls = {"tolist": 0}
    tolist = torch.Tensor.tolist

    def counting_tolist(self):
        calls["tolist"] += 1
        return tolist(self)

    def no_item(self):
        raise AssertionError(".item() during a batched step")

    monkeypatch.setattr(torch.Tensor, "tolist", counting_tolist)
    monkeypatch.setattr(torch.Tensor, "item", no_item)
    assert len(sample_batch(logits, rows)) == 7
    assert calls["tolist"] == 1


def test_nan_row_raises_like_multinomial() -> None:
    logits = _logits(3, 50, seed=0)
    logits[1, 4] = float("nan")
    params = [SamplingParams(temperature=1.0, seed=i) for i in range(3)]
    with pytest.raises(RuntimeError, match="probability tensor contains"):
        sample(logits[1], params[1], make_generator(1))
    with pytest.raises(RuntimeError, match=re.escape(INVALID_PROBS)):
        sample_batch(logits, SamplingRows.build(params, _generators(params, 0), 50, "cpu"))


def test_drawing_rows_need_a_generator() -> None:
    with pytest.raises(ValueError, match="needs a torch.Generator"):
        SamplingRows.build([SamplingParams(temperature=1.0)], [None], 10, "cpu")
    rows = SamplingRows.build([SamplingParams(temperature=0.0)], [None], 10, "cpu")
    assert sample_batch(torch.arange(10.0).reshape(1, 10), rows)[0].token_id == 9


def test_no_rows_sample_nothing() -> None:
    rows = SamplingRows.build([], [], 10, "cpu")
    assert sample_batch(torch.zeros(0, 10), rows) == []


@pytest.mark.parametrize("v", [6, 1001, 151_936])
def test_each_filter_matches_the_reference_bit_for_bit(v: int) -> None:
    x = _logits(5, v, seed=v)
    temps = [0.7, 1.0, 1.3, 0.1, 2.9]
    ks, ps = [3, 3, 0, 5, v], [0.9, 1.0, 0.5, 0.9, 0.25]
    params = [SamplingParams(temperature=t, top_k=k, top_p=p, seed=0)
              for t, k, p in zip(temps, ks, ps)]
    rows = SamplingRows.build(params, _generators(params, 0), v, "cpu")
    scaled = scale_by_temperature(x.clone(), rows.temperature)
    assert all(torch.equal(scaled[i], x[i] / t) for i, t in enumerate(temps))
    top_k = apply_top_k_rows(scaled.clone(), rows.top_k)
    assert all(torch.equal(top_k[i], apply_top_k(scaled[i], k)) for i, k in enumerate(ks))
    top_p = apply_top_p_rows(top_k.clone(), rows.top_p)
    assert all(torch.equal(top_p[i], apply_top_p(top_k[i], p)) for i, p in enumerate(ps))


@pytest.mark.parametrize("head", [4, 16, 64])
def test_top_p_decided_in_the_head_matches_the_full_sort(monkeypatch, head: int) -> None:
    monkeypatch.setattr(batch_filters, "TOP_P_HEAD", head)
    decided = []
    in_head = batch_filters._nucleus_in_head
    monkeypatch.setattr(batch_filters, "_nucleus_in_head",
                        lambda probs, p: decided.extend((r := in_head(probs, p))[1].tolist()) or r)
    g = torch.Generator().manual_seed(head)
    peaked = torch.randn(4, 300, generator=g) * 6  # [4, 300]
    tied = torch.round(torch.randn(4, 300, generator=g) * 2) / 2  # runs of equal values
    top_k = apply_top_k(torch.randn(300, generator=g) * 3, head // 2).expand(4, 300)
    for x in (peaked, tied, top_k.clone(), torch.zeros(4, 300)):
        for p in (0.05, 0.3, 0.5, 0.9, 0.99, 1 - 1e-7):
            params = [SamplingParams(top_p=p, seed=0)] * 4
            rows = SamplingRows.build(params, _generators(params, 0), 300, "cpu")
            got = apply_top_p_rows(x.clone(), rows.top_p)
            assert all(torch.equal(got[i], apply_top_p(x[i], p)) for i in range(4)), p
    assert any(decided) and not all(decided)  # both ways were taken


@pytest.mark.parametrize("inference", [False, True])
def test_draws_spread_over_threads_match(monkeypatch, inference: bool) -> None:
    monkeypatch.setattr(seeded_draw, "PARALLEL_DRAW_MIN_VOCAB", 1)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)  # three draw threads, 7 rows
    with torch.inference_mode(inference):
        _compare(_logits(7, 1000, seed=11), _batch(7, 1))
