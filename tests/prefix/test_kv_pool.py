"""KV page pool: allocation, writer + token-slot refcounts, double-free and bad-input errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from freetoken.prefix.kv_pool import KVLayout, KVPagePool, OutOfPages, num_pages_for

LAYOUT = KVLayout(num_layers=3, num_kv_heads=2, head_dim=8, dtype=torch.bfloat16)


def make_pool(num_pages: int = 6, page_size: int = 4) -> KVPagePool:
    return KVPagePool(LAYOUT, num_pages=num_pages, page_size=page_size, device="cpu")


def test_layout_bytes_and_pages_for_budget():
    assert LAYOUT.bytes_per_token() == 2 * 3 * 2 * 8 * 2
    fp32 = KVLayout(1, 4, 16, torch.float32)
    assert fp32.bytes_per_token() == 2 * 1 * 4 * 16 * 4
    # 192 bytes/token * 4 tokens = 768 bytes/page
    assert num_pages_for(768 * 10 + 767, LAYOUT, 4) == 10
    assert num_pages_for(0, LAYOUT, 4) == 0
    with pytest.raises(ValueError, match="num_layers == 0"):
        num_pages_for(1000, KVLayout(0, 1, 1, torch.float16), 4)
    with pytest.raises(ValueError, match="page_size must be >= 1, got 0"):
        num_pages_for(1000, LAYOUT, 0)


def test_layout_rejects_bad_fields():
    with pytest.raises(ValueError, match=r"num_kv_heads must be an int >= 1, got 0"):
        KVLayout(1, 0, 8, torch.float16)
    with pytest.raises(ValueError, match=r"num_layers must be an int >= 0, got -1"):
        KVLayout(-1, 1, 8, torch.float16)
    with pytest.raises(ValueError, match=r"dtype must be a torch.dtype, got 'fp16'"):
        KVLayout(1, 1, 8, "fp16")
    assert KVLayout(np.int64(2), 1, 8, torch.float16).num_layers == 2


def test_storage_shape_dtype_device_and_page_slots():
    pool = make_pool()
    assert pool.num_slots == 24
    assert pool.k.shape == (3, 24, 2, 8) and pool.v.shape == (3, 24, 2, 8)
    assert pool.k.dtype == torch.bfloat16 and pool.k.device.type == "cpu"
    assert pool.k.data_ptr() != pool.v.data_ptr()
    assert pool.page_slots(2) == range(8, 12)
    assert pool.slots_of_pages([2, 0]).tolist() == [8, 9, 10, 11, 0, 1, 2, 3]
    assert pool.pages_for_tokens(9) == 3 and pool.pages_for_tokens(8) == 2
    with pytest.raises(ValueError, match="page 6 outside the pool's 6 pages"):
        pool.page_slots(6)
    with pytest.raises(ValueError, match="num_pages must be an int >= 1, got 0"):
        KVPagePool(LAYOUT, 0, 4)


def test_alloc_is_all_or_nothing_and_release_frees():
    pool = make_pool()
    a = pool.alloc_pages(4)
    assert a == [0, 1, 2, 3]
    assert pool.num_free_pages == 2 and pool.num_used_pages == 4
    with pytest.raises(OutOfPages) as err:
        pool.alloc_pages(3)
    assert str(err.value) == "KV page pool exhausted: asked for 3 pages, 2 free"
    assert (err.value.requested, err.value.free) == (3, 2)
    assert pool.num_free_pages == 2  # nothing taken
    assert pool.alloc_pages(0) == []
    with pytest.raises(ValueError, match="cannot allocate -1 pages"):
        pool.alloc_pages(-1)
    pool.release_pages([1, 3])
    assert pool.refcounts().tolist() == [1, 0, 1, 0, 0, 0]
    assert pool.num_free_pages == 4
    # freed pages are handed out again (LIFO), refcount back to 1
    assert sorted(pool.alloc_pages(2)) == [1, 3]
    pool.check_invariants()


def test_double_free_raises_and_changes_nothing():
    pool = make_pool()
    pages = pool.alloc_pages(2)
    pool.release_pages(pages)
    with pytest.raises(RuntimeError, match=r"double free of KV pages \[0\]"):
        pool.release_pages([0])
    pool.alloc_pages(1)  # page 1 again (LIFO)
    with pytest.raises(RuntimeError, match=r"double free of KV pages \[1\]"):
        pool.release_pages([1, 1])
    assert pool.refcounts().tolist() == [0, 1, 0, 0, 0, 0]
    pool.check_invariants()


def test_writer_and_token_refs_add_up():
    pool = make_pool(page_size=4)
    p0, p1 = pool.alloc_pages(2)  # slots 0..3 and 4..7
    # a holder keeps slots 0..5 (4 on page 0, 2 on page 1), passed as a torch tensor
    pool.incref(torch.arange(6))
    assert pool.refcounts()[[p0, p1]].tolist() == [5, 3]
    # a second holder refs slots 1 and 6 via numpy, one list with repeats
    pool.incref(np.array([1, 6]))
    pool.incref([7, 7])
    assert pool.refcounts()[[p0, p1]].tolist() == [6, 6]
    pool.release_pages([p0, p1])  # writer done: pages stay used by the token refs
    assert pool.num_free_pages == 4
    pool.decref(range(6))
    pool.decref([1])
    assert pool.refcounts()[[p0, p1]].tolist() == [0, 3]
    assert pool.num_free_pages == 5
    pool.decref(torch.tensor([6, 7, 7]))
    assert pool.num_free_pages == 6
    pool.check_invariants()


def test_decref_below_zero_is_atomic():
    pool = make_pool(page_size=2)
    pool.alloc_pages(2)  # pages 0, 1: slots 0..3
    with pytest.raises(RuntimeError, match=r"double free of KV pages \[0\]"):
        pool.decref([2, 0, 1])  # page 1 could go to 0 but page 0 would go to -1
    assert pool.refcounts()[:2].tolist() == [1, 1]
    pool.check_invariants()


def test_bad_slots_are_rejected():
    pool = make_pool()
    pool.alloc_pages(1)
    with pytest.raises(ValueError, match="token slot 24 outside the pool's 24 slots"):
        pool.incref([0, 24])
    with pytest.raises(ValueError, match="token slot -1 outside the pool's 24 slots"):
        pool.decref([-1])
    with pytest.raises(TypeError, match="token slots must be integers, got dtype float64"):
        pool.incref([0.5])
    with pytest.raises(TypeError, match="got a torch.float32 tensor"):
        pool.incref(torch.zeros(2))
    with pytest.raises(RuntimeError, match=r"incref of token slots on free KV pages \[1\]"):
        pool.incref([0, 4, 5])
    assert pool.refcounts().tolist() == [1, 0, 0, 0, 0, 0]
    pool.incref([])  # empty is a no-op
    pool.decref(np.zeros(0, dtype=np.int64))
    pool.check_invariants()


def test_check_invariants_catches_corruption():
    pool = make_pool()
    pool.alloc_pages(2)
    pool._free.append(5)  # page 5 listed twice
    with pytest.raises(AssertionError, match="twice"):
        pool.check_invariants()
    pool._free.pop()
    pool._ref[0] = 0  # a page with refcount 0 missing from the free list
    with pytest.raises(AssertionError, match="free list differs"):
        pool.check_invariants()


def test_zero_layer_pool_has_slots_but_no_storage():
    pool = KVPagePool(KVLayout(0, 1, 1, torch.float32), num_pages=2, page_size=3)
    assert pool.k.shape == (0, 6, 1, 1)
    assert pool.alloc_pages(2) == [0, 1]
