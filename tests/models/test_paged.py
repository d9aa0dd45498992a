"""Paged KV state (``freetoken.models.paged``): bit-identical to the contiguous KV cache, restorable
from a shared prefix + a recurrent-state checkpoint, with clear errors and the pool layouts."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from freetoken.models.config import ModelConfig
from freetoken.models.paged import PagedKV, SlotTable
from freetoken.models.qwen3_moe import Qwen3MoeForCausalLM
from freetoken.models.qwen3_next import Qwen3NextForCausalLM
from freetoken.models.registry import load_model
from freetoken.models.rotary import RotaryTable
from freetoken.models.state import GDNState, KVCache
from freetoken.prefix.checkpoints import RecurrentLayout
from freetoken.prefix.kv_pool import KVLayout, KVPagePool
from tests.models.conftest import prompt_ids

PAGE = 4
PROMPT = 11
STEPS = 8


@pytest.fixture(scope="module")
def model(arch, tiny_checkpoint):
    path = tiny_checkpoint(arch)
    return load_model(path), prompt_ids(path, PROMPT + 3)


def shuffled_slots(pool: KVPagePool, pages: int, seed: int) -> list[int]:
    """Token slots of ``pages`` freshly allocated pages, the pages in a shuffled order."""
    got = pool.alloc_pages(pages)
    random.Random(seed).shuffle(got)
    return [s for p in got for s in pool.page_slots(p)]


def test_paged_state_is_bit_identical_to_the_contiguous_cache(model) -> None:
    ft, ids = model
    pool = KVPagePool(ft.kv_layout(), num_pages=12, page_size=PAGE)
    pool.k.zero_(), pool.v.zero_()  # storage starts uninitialised; zero it to see writes
    pool.alloc_pages(1)  # page 0 taken: the sequence never starts at slot 0
    slots = shuffled_slots(pool, 6, seed=1)
    assert slots != sorted(slots)  # non-contiguous, out of order
    table = SlotTable(slots)
    paged, plain = ft.new_paged_state(pool, table), ft.new_state()

    a, b = ft(ids[:PROMPT], paged), ft(ids[:PROMPT], plain)
    assert torch.equal(a, b)
    for _ in range(STEPS):
        token = a[-1].argmax().reshape(1)
        a, b = ft(token, paged), ft(token, plain)
        assert torch.equal(a, b)
    n = PROMPT + STEPS
    assert paged.num_tokens == plain.num_tokens == n
    caches = [c for c in plain.layers if isinstance(c, KVCache)]
    kvs = [c for c in paged.layers if isinstance(c, PagedKV)]
    assert [kv.layer for kv in kvs] == list(range(len(caches))) and len(caches) >= 1
    used = torch.tensor(slots[:n])
    for j, (kv, cache) in enumerate(zip(kvs, caches)):
        assert kv.length == n and kv.table is table
        # the pool holds exactly the contiguous cache's rows, at the table's slots
        assert torch.equal(pool.k[j, used].transpose(0, 1), cache.k[:, :n])
        assert torch.equal(pool.v[j, used].transpose(0, 1), cache.v[:, :n])
    untouched = torch.tensor(sorted(set(range(pool.num_slots)) - set(slots[:n])))
    assert not pool.k[:, untouched].any() and not pool.v[:, untouched].any()


def test_restored_prefix_and_checkpoint_continue_exactly(model) -> None:
    ft, ids = model
    c = 6  # not a page boundary: the restored sequence shares half of a page
    pool = KVPagePool(ft.kv_layout(), num_pages=16, page_size=PAGE)
    table_a = SlotTable(shuffled_slots(pool, 6, seed=2))
    full = ft.new_paged_state(pool, table_a)
    ft(ids[:c], full)
    checkpoint = [t.clone() for t in ft.recurrent_tensors(full)]
    expected = [ft(ids[c:], full)]
    for _ in range(4):
        expected.append(ft(expected[-1][-1].argmax().reshape(1), full))

    fresh = shuffled_slots(pool, 6, seed=3)
    assert not set(fresh) & set(table_a.valid().tolist())
    table_b = SlotTable(table_a.valid()[:c])
    table_b.extend(fresh)

    def restored(copy_checkpoint: bool):
        state = ft.new_paged_state(pool, table_b, num_tokens=c)
        assert state.num_tokens == c
        live = ft.recurrent_tensors(state)
        assert ft.recurrent_layout() == RecurrentLayout.of(live)
        if copy_checkpoint:
            for dst, src in zip(live, checkpoint):
                dst.copy_(src)
        return state

    state = restored(True)
    got = [ft(ids[c:], state)]
    for _ in range(4):
        got.append(ft(got[-1][-1].argmax().reshape(1), state))
    for e, g in zip(expected, got):
        assert torch.equal(e, g)
    assert state.num_tokens == full.num_tokens == PROMPT + 3 + 4
    if checkpoint:  # hybrid: without the checkpoint the GDN layers start from zero and differ
        wrong = ft(ids[c:], restored(False))  # (by far more than fp32 rounding, ~1e-6)
        assert (wrong - expected[0]).abs().max().item() > 1e-4
    else:
        assert not any(isinstance(s, GDNState) for s in full.layers)


def test_slot_table_too_short_leaves_everything_unchanged(model) -> None:
    ft, ids = model
    pool = KVPagePool(ft.kv_layout(), num_pages=4, page_size=PAGE)
    pool.k.zero_(), pool.v.zero_()  # storage starts uninitialised (NaN bits never compare equal)
    table = SlotTable(shuffled_slots(pool, 2, seed=4)[:7])
    state = ft.new_paged_state(pool, table)
    ft(ids[:5], state)
    k_before = pool.k.clone()
    with pytest.raises(RuntimeError) as err:
        ft(ids[5:8], state)
    assert str(err.value) == ("slot table has 7 token slots but attention layer 0 needs 8 "
                              "(5 cached + 3 new); extend the SlotTable before the forward")
    assert state.num_tokens == 5
    assert all(kv.length == 5 for kv in state.layers if isinstance(kv, PagedKV))
    assert torch.equal(pool.k, k_before)
    table.extend([pool.num_slots - 1])
    assert ft(ids[5:8], state).shape == (1, ft.config.vocab_size)
    assert state.num_tokens == 8


def test_paged_kv_append_gathers_in_position_order() -> None:
    layout = KVLayout(num_layers=2, num_kv_heads=2, head_dim=3, dtype=torch.float32)
    pool = KVPagePool(layout, num_pages=3, page_size=2)
    pool.k.zero_(), pool.v.zero_()  # storage starts uninitialised; zero it to see writes
    table = SlotTable([5, 0, 3])
    kv = PagedKV(pool, 1, table)
    k1, k2 = torch.randn(2, 2, 3), torch.randn(1, 2, 3)
    kv.append(k1, -k1)
    keys, values = kv.append(k2, -k2)
    expected = torch.cat([k1, k2]).transpose(0, 1)
    assert keys.shape == (2, 3, 3) and torch.equal(keys, expected)
    assert torch.equal(values, -expected) and kv.length == 3
    assert torch.equal(pool.k[1, [5, 0, 3]], torch.cat([k1, k2]))
    assert not pool.k[0].any() and not pool.k[1, [1, 2, 4]].any()
    with pytest.raises(RuntimeError) as err:
        kv.append(k2, k2)
    assert str(err.value) == ("slot table has 3 token slots but attention layer 1 needs 4 "
                              "(3 cached + 1 new); extend the SlotTable before the forward")
    with pytest.raises(ValueError, match="attention layer 2 outside the pool's 2 layers"):
        PagedKV(pool, 2, table)


def test_slot_table_grows_truncates_and_rejects_bad_slots() -> None:
    table = SlotTable()
    assert table.length == 0 and table.valid().tolist() == []
    table.extend(range(40, 0, -2))
    table.extend(torch.tensor([7]))
    assert table.length == 21 and table.capacity == 32
    assert table.valid().tolist() == list(range(40, 0, -2)) + [7]
    table.truncate(3)
    assert table.valid().tolist() == [40, 38, 36]
    table.extend([1])
    assert table.valid().tolist() == [40, 38, 36, 1]
    with pytest.raises(ValueError, match=r"cannot truncate a slot table of 4 slots to 5"):
        table.truncate(5)
    with pytest.raises(ValueError, match=r"token slots must be >= 0, got -1"):
        table.extend([3, -1])
    with pytest.raises(ValueError, match=r"slots must be a 1-D integer sequence"):
        table.extend(torch.tensor([1.5]))
    assert table.length == 4


def test_slot_table_python_ints_and_tensors_fill_it_alike() -> None:
    """Lists of Python ints go through the table's numpy view; the tensor view sees them, also
    across growth, and every other input kind gives the same table."""
    fast, slow = SlotTable(), SlotTable()
    for i in range(70):  # one slot per decode step, past four doublings of the capacity
        fast.extend([3 * i])
        slow.extend(torch.tensor([3 * i]))
    fast.extend((1, 2))
    slow.extend(np.array([1, 2]))
    assert fast.capacity == slow.capacity == 128
    assert torch.equal(fast.valid(), slow.valid())
    assert fast.valid().tolist() == [3 * i for i in range(70)] + [1, 2]
    fast.extend([np.int64(9), 10])  # not all Python ints: the tensor path
    assert fast.valid()[-2:].tolist() == [9, 10]
    fast.extend([])
    with pytest.raises(ValueError, match=r"^token slots must be >= 0, got -4$"):
        fast.extend([5, -4])
    assert fast.length == 74


def test_rotary_at_one_position_is_the_gathered_row() -> None:
    rotary = RotaryTable(rotary_dim=16, theta=1e4)
    for p in (0, 7, 300):  # 300: past the initial table, which grows
        cos, sin = rotary.at([p])
        ref_cos, ref_sin = rotary.at([p, p])
        assert cos.shape == (1, 8) and cos.is_contiguous() and sin.is_contiguous()
        assert torch.equal(cos, ref_cos[:1]) and torch.equal(sin, ref_sin[:1])


def test_new_paged_state_rejects_a_foreign_pool_or_short_table(model) -> None:
    ft, _ = model
    other = KVLayout(num_layers=ft.kv_layout().num_layers, num_kv_heads=1, head_dim=64,
                     dtype=torch.float32)
    with pytest.raises(ValueError, match="does not match the model's"):
        ft.new_paged_state(KVPagePool(other, 1, PAGE), SlotTable())
    pool = KVPagePool(ft.kv_layout(), 2, PAGE)
    with pytest.raises(ValueError) as err:
        ft.new_paged_state(pool, SlotTable([0, 1]), num_tokens=3)
    assert str(err.value) == "slot table has 2 token slots, fewer than the 3 restored tokens"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layouts_follow_the_config(tiny_checkpoint, dtype) -> None:
    def build(arch, cls):
        raw = json.loads((tiny_checkpoint(arch) / "config.json").read_text())
        return cls(ModelConfig.from_hf(raw), dtype=dtype, device="meta")

    item = 4 if dtype == torch.float32 else 2
    moe = build("qwen3_moe", Qwen3MoeForCausalLM)
    c = moe.config
    assert (c.num_hidden_layers, c.num_key_value_heads, c.head_dim) == (4, 2, 64)
    assert moe.kv_layout() == KVLayout(4, 2, 64, dtype)
    assert moe.kv_layout().bytes_per_token() == 2 * 4 * 2 * 64 * item
    assert moe.recurrent_layout() == RecurrentLayout(())
    assert moe.recurrent_layout().bytes_per_checkpoint() == 0

    nxt = build("qwen3_next", Qwen3NextForCausalLM)
    c = nxt.config
    assert nxt.kv_layout() == KVLayout(1, 2, 64, dtype)  # 3 GDN layers + 1 attention layer
    assert nxt.kv_layout().bytes_per_token() == 2 * 1 * 2 * 64 * item
    conv_dim = 2 * c.linear_num_key_heads * c.linear_key_head_dim \
        + c.linear_num_value_heads * c.linear_value_head_dim
    assert (conv_dim, c.linear_conv_kernel_dim) == (512, 4)
    per_layer = (((512, 3), dtype), ((4, 64, 64), torch.float32))
    assert nxt.recurrent_layout() == RecurrentLayout(per_layer * 3)
    assert nxt.recurrent_layout().bytes_per_checkpoint() == 3 * (512 * 3 * item + 4 * 64 * 64 * 4)


def test_recurrent_tensors_are_the_live_state(model) -> None:
    ft, _ = model
    state = ft.new_state()
    tensors = ft.recurrent_tensors(state)
    gdn = [s for s in state.layers if isinstance(s, GDNState)]
    assert len(tensors) == 2 * len(gdn)
    for i, s in enumerate(gdn):
        assert tensors[2 * i] is s.conv and tensors[2 * i + 1] is s.recurrent
