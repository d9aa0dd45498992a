"""OpenAI ``logit_bias`` through the engine: added per request to the step's [B, V] logits."""

from __future__ import annotations

import math

import pytest
import torch

from freetoken.engine.engine import Engine
from freetoken.engine.logit_bias import LogitBiases
from tests.engine.fake_model import ScriptedLM
from tests.engine.helpers import ids_of, info, request, run_alone, tokenizer

PROMPT = [11, 12, 13, 14, 15]
SCRIPT = [300, 301, 302, 303]
FILLER = 7


def _engine() -> Engine:
    tok = tokenizer()
    return Engine(ScriptedLM(tok.vocab_size, len(PROMPT), SCRIPT, FILLER), tok, info(eos=()))


def test_apply_adds_each_rows_bias_and_leaves_the_raw_logits():
    biases = LogitBiases()
    biases.add(1, ((2, 100.0), (0, -5.5)), torch.device("cpu"))
    logits = torch.zeros(3, 4)
    out = biases.apply(logits, [0, 1, None])
    assert out.tolist() == [[0, 0, 0, 0], [-5.5, 0, 100, 0], [0, 0, 0, 0]]
    assert logits.eq(0).all()  # raw logits kept for logprobs
    assert biases.apply(logits, [0, None, 2]) is logits  # no biased row: no copy


def test_plus_100_forces_a_token_under_greedy():
    forced = 500
    out = run_alone(_engine(), request(PROMPT, max_tokens=4, logit_bias=((forced, 100.0),)))
    assert ids_of(out) == [forced] * 4


def test_minus_100_bans_the_token_greedy_would_pick():
    engine = _engine()
    assert ids_of(run_alone(engine, request(PROMPT, max_tokens=1))) == [300]
    out = run_alone(engine, request(PROMPT, max_tokens=1, logit_bias=((300, -100.0),)), key=1)
    assert ids_of(out) == [0]  # every other logit is 0: the lowest id wins the tie


def test_logprobs_stay_those_of_the_raw_logits():
    out = run_alone(_engine(), request(PROMPT, max_tokens=1, logprobs=1,
                                       logit_bias=((500, 100.0),)))
    (lp,) = out[0].logprobs
    v = tokenizer().vocab_size
    assert lp.token_id == 500
    assert lp.logprob == pytest.approx(-math.log(math.exp(10.0) + (v - 1)), abs=1e-4)
    assert lp.top[0][0] == 300  # the raw distribution's favourite


def test_bias_applies_to_its_own_row_only_in_a_shared_batch():
    engine = _engine()
    chunks: dict[int, list] = {0: [], 1: []}
    engine.add_request(0, request(PROMPT, "a", max_tokens=3), chunks[0].append)
    engine.add_request(1, request(PROMPT, "b", max_tokens=3, logit_bias=((500, 100.0),)),
                       chunks[1].append)
    while engine.step():
        pass
    assert ids_of(chunks[0]) == SCRIPT[:3]
    assert ids_of(chunks[1]) == [500] * 3
    assert not engine.runner._biases  # released with the request


def test_unbiased_steps_never_touch_the_bias_path(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("bias path taken without a biased request")

    monkeypatch.setattr(LogitBiases, "apply", fail)
    monkeypatch.setattr(LogitBiases, "add", fail)
    assert ids_of(run_alone(_engine(), request(PROMPT, max_tokens=4))) == SCRIPT
