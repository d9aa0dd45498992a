"""Chunked prefill == one-shot prefill == token-by-token decode, plus the state and input checks."""

from __future__ import annotations

import pytest
import torch

from freetoken.models import attention
from freetoken.models.registry import load_model
from freetoken.models.state import KVCache
from tests.models.conftest import prompt_ids

LENGTH = 150
TOL = 1e-4


@pytest.fixture(scope="module")
def model(arch, tiny_checkpoint):
    path = tiny_checkpoint(arch)
    return load_model(path), prompt_ids(path, LENGTH)


def test_chunked_one_shot_and_decode_agree(model) -> None:
    ft, ids = model
    one_shot = ft(ids, ft.new_state(), all_logits=True)

    ft.prefill_chunk = 32
    try:
        state = ft.new_state()
        chunked = ft(ids, state, all_logits=True)
    finally:
        ft.prefill_chunk = 1024
    split_state = ft.new_state()
    split = torch.cat([ft(ids[a:b], split_state, all_logits=True)
                       for a, b in ((0, 37), (37, 38), (38, 101), (101, LENGTH))])
    step_state = ft.new_state()
    steps = torch.cat([ft(ids[i : i + 1], step_state) for i in range(LENGTH)])

    for other in (chunked, split, steps):
        assert other.shape == one_shot.shape == (LENGTH, ft.config.vocab_size)
        assert (other - one_shot).abs().max().item() <= TOL
    # the carried states continue identically
    token = torch.tensor([7])
    after = [ft(token, s)[0] for s in (state, split_state, step_state)]
    for s in (state, split_state, step_state):
        assert s.num_tokens == LENGTH + 1
    assert max((a - after[0]).abs().max().item() for a in after) <= TOL


def test_long_prefill_never_builds_a_full_mask(model, monkeypatch) -> None:
    ft, ids = model
    seen = []
    build = attention.AttnContext.build

    def recording(start, length, rotary, dtype, capture=()):
        ctx = build(start, length, rotary, dtype, capture)
        seen.append((start, length, None if ctx.mask is None else tuple(ctx.mask.shape)))
        return ctx

    monkeypatch.setattr(attention.AttnContext, "build", staticmethod(recording))
    monkeypatch.setattr(ft, "prefill_chunk", 64)
    ft(ids, ft.new_state())
    assert seen == [(0, 64, None), (64, 64, (64, 128)), (128, 22, (22, 150))]


def test_kv_cache_grows_and_keeps_content() -> None:
    cache = KVCache(num_kv_heads=2, head_dim=3, dtype=torch.float32, capacity=4)
    chunks = [torch.randn(n, 2, 3) for n in (3, 1, 5, 1)]
    for c in chunks:
        keys, values = cache.append(c, -c)
    expected = torch.cat(chunks).transpose(0, 1)
    assert cache.length == 10 and cache.capacity == 18  # 4 -> 9 (needed) -> 18 (doubled)
    assert torch.equal(keys, expected) and torch.equal(values, -expected)


@pytest.mark.parametrize("bad, message", [
    (torch.tensor([], dtype=torch.int64), "input_ids must be a non-empty 1-D tensor of token ids"),
    (torch.tensor([[1, 2]]), "input_ids must be a non-empty 1-D tensor of token ids"),
    (torch.tensor([1.0, 2.0]), "input_ids must be int64, got torch.float32"),
    (torch.tensor([1, 8256]), "token id 8256 out of range [0, 8256)"),
    (torch.tensor([-1, 3]), "token id -1 out of range [0, 8256)"),
])
def test_bad_input_ids(model, bad, message) -> None:
    ft, _ = model
    state = ft.new_state()
    with pytest.raises(ValueError) as err:
        ft(bad, state)
    assert str(err.value) == message
    assert state.num_tokens == 0


def test_context_longer_than_max_positions(model) -> None:
    ft, _ = model
    state = ft.new_state()
    state.num_tokens = ft.config.max_position_embeddings
    with pytest.raises(ValueError) as err:
        ft(torch.tensor([1]), state)
    limit = ft.config.max_position_embeddings  # 262144 (Qwen families), 131072 (GLM)
    assert limit in (262144, 131072)
    assert str(err.value) == (
        f"sequence of {limit + 1} tokens exceeds max_position_embeddings {limit}")
