"""The runner's sampling through the engine: one batched call per step, and exactly the outputs
the per-row reference sampler gives for mixed concurrent requests."""

from __future__ import annotations

import torch

from freetoken.constrain.spec import GrammarError
from freetoken.engine import runner, step_sampling
from freetoken.engine.engine import Engine
from freetoken.engine.sampler import sample
from freetoken.engine.step_sampling import GrammarFailed
from tests.engine.fake_model import RecurrentLM
from tests.engine.helpers import ids_of, info, request, tokenizer

PROMPTS = [[(i * 37 + k * 11) % 8000 for i in range(40 + 9 * k)] for k in range(7)]
SAMPLING = [  # greedy, seeded draws with every filter, logprobs, logit bias
    {"temperature": 0.0},
    {"temperature": 1.0, "seed": 1},
    {"temperature": 0.7, "top_k": 40, "seed": 2, "logprobs": 3},
    {"temperature": 1.2, "top_p": 0.8, "seed": 3, "logit_bias": ((500, 4.0), (7, -100.0))},
    {"temperature": 0.0, "logprobs": 5, "logit_bias": ((300, 2.5),)},
    {"temperature": 0.9, "top_k": 9, "top_p": 0.6, "seed": 4, "logprobs": 0},
    {"temperature": 1e-6, "seed": 5, "logprobs": 1},
]


class _EvenIds:
    """A stand-in grammar matcher: allows only even ids; its ``allowed`` fails on call
    ``fail_at``, and its ``advance`` rejects the ``reject_at``-th token (1-based)."""

    def __init__(self, fail_at: int | None = None, reject_at: int | None = None) -> None:
        self.fail_at, self.reject_at = fail_at, reject_at
        self.calls, self.taken = 0, []

    def allowed(self, n: int, device) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.fail_at:
            raise GrammarError("stub grammar failed")
        mask = torch.zeros(n, dtype=torch.bool, device=device)
        mask[::2] = True
        return mask

    def advance(self, token_id: int) -> None:
        if len(self.taken) + 1 == self.reject_at:
            raise GrammarError(f"stub grammar rejected {token_id}")
        assert token_id % 2 == 0
        self.taken.append(token_id)

    def sample(self, logits, params, generator, raw_logits=None):
        """What ``ToolCallMatcher.sample`` does: mask, per-row sample, advance."""
        picked = sample(logits, params, generator, self.allowed(logits.shape[-1], logits.device),
                        raw_logits=raw_logits)
        self.advance(picked.token_id)
        return picked


def _per_row_entries(entries, generators, logits, biases, constraints, sampleable_vocab):
    """The reference: the runner's sampling before batching, one ``sample`` call per row."""
    picking = logits
    if biases:
        picking = biases.apply(logits, [w.request_key if w.sample else None for w in entries])
    picked = {}
    for row, work in enumerate(entries):
        if not work.sample:
            continue
        last, raw = picking[row], logits[row]  # [V], [V]
        if sampleable_vocab is not None and sampleable_vocab < last.shape[-1]:
            last, raw = last[:sampleable_vocab], raw[:sampleable_vocab]
        raw = None if picking is logits else raw
        matcher = constraints.get(work.request_key) if constraints else None
        if matcher is None:
            picked[row] = sample(last, work.sampling, generators[row], raw_logits=raw)
            continue
        try:
            picked[row] = matcher.sample(last, work.sampling, generators[row], raw_logits=raw)
        except GrammarError as exc:
            picked[row] = GrammarFailed(str(exc))
    return picked


def _run(n: int, grammars: dict[int, _EvenIds] | None = None) -> dict[int, list]:
    """Serve the first ``n`` requests together (small token budget: prefill chunks share steps
    with decode rows); returns each request's chunks."""
    tok = tokenizer()
    # 38 padded logit columns past the tokenizer's vocabulary: the runner must cut them off
    engine = Engine(RecurrentLM(tok.vocab_size + 38, seed=4), tok, info(eos=()),
                    max_num_batched_tokens=48)
    chunks: dict[int, list] = {k: [] for k in range(n)}
    for k in range(n):
        engine.add_request(k, request(PROMPTS[k], f"r{k}", max_tokens=6, **SAMPLING[k]),
                           chunks[k].append)
    for k, matcher in (grammars or {}).items():
        engine.runner.constraints[k] = matcher
    while engine.step():
        pass
    return chunks


def test_mixed_requests_match_the_per_row_reference(monkeypatch) -> None:
    for n in (1, 3, 7):
        got = _run(n)
        with monkeypatch.context() as m:
            m.setattr(runner, "sample_entries", _per_row_entries)
            want = _run(n)
        assert got == want
        assert all(c[-1].finish_reason == "length" for c in got.values())


def test_grammar_rows_and_failures_match_the_per_row_reference(monkeypatch) -> None:
    def grammars() -> dict[int, _EvenIds]:
        return {1: _EvenIds(), 2: _EvenIds(fail_at=3), 4: _EvenIds(reject_at=2), 5: _EvenIds()}

    got = _run(7, grammars())
    with monkeypatch.context() as m:
        m.setattr(runner, "sample_entries", _per_row_entries)
        want = _run(7, grammars())
    assert got == want
    assert got[2][-1].finish_reason == "error" and "stub grammar failed" in got[2][-1].error
    assert got[4][-1].finish_reason == "error" and "rejected" in got[4][-1].error
    assert all(t % 2 == 0 for k in (1, 5) for t in ids_of(got[k]))


def test_one_sampler_call_per_step_that_samples(monkeypatch) -> None:
    seen: list[int] = []
    batched = step_sampling.sample_batch

    def spy(logits, rows, *args, **kwargs):
        seen.append(logits.shape[0])
        return batched(logits, rows, *args, **kwargs)

    monkeypatch.setattr(step_sampling, "sample_batch", spy)
    chunks = _run(7)
    sampled = sum(c[-1].completion_tokens for c in chunks.values())
    assert sum(seen) == sampled == 7 * 6  # every token came from a batched call
    assert max(seen) > 1  # decode rows of several requests shared one call
