"""Two-tier recurrent-state checkpoint store: exact copies, spills, value-aware drops, stats."""

from __future__ import annotations

import itertools

import pytest
import torch

from freetoken.prefix.checkpoints import CheckpointStore, RecurrentLayout

from tests.prefix.stand_ins import Node

# conv state [conv_dim, K-1] in bf16 and delta-rule memory [Hv, dk, dv] in fp32, for 2 GDN layers.
LAYOUT = RecurrentLayout((((6, 3), torch.bfloat16), ((2, 4, 4), torch.float32),
                          ((6, 3), torch.bfloat16), ((2, 4, 4), torch.float32)))
BPC = 2 * (18 * 2 + 32 * 4)  # 328 bytes per checkpoint
# The CUDA device tier (and pinned host tier) is exercised where a GPU exists.
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def child(parent: Node, depth: int) -> Node:
    node = Node(parent=parent, depth=depth)
    parent.children[depth] = node
    return node


def chain(parent: Node, *depths: int) -> list[Node]:
    nodes = []
    for d in depths:
        parent = child(parent, d)
        nodes.append(parent)
    return nodes


def state(seed: int) -> list[torch.Tensor]:
    """Live state tensors with every bit pattern class: random values, NaN payloads, -0.0, inf."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for shape, dtype in LAYOUT.shapes:
        t = torch.randn(shape, generator=g).to(dtype)
        flat = t.view(-1)
        flat[0], flat[1], flat[2] = float("nan"), -0.0, float("inf")
        if dtype == torch.float32:
            flat.view(torch.int32)[3] = 0x7FC01234  # a NaN with a payload
        out.append(t)
    return out


def bits(tensors) -> list[torch.Tensor]:
    return [t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32).clone() for t in tensors]


def assert_bit_equal(a, b) -> None:
    assert all(torch.equal(x, y) for x, y in zip(bits(a), bits(b)))


def zeros() -> list[torch.Tensor]:
    return [torch.zeros(shape, dtype=dtype) for shape, dtype in LAYOUT.shapes]


def make(device_slots: int, host_checkpoints: int, keep_deepest: int = 2, extra_host_bytes: int = 0,
         device: str = "cpu"):
    ticks = itertools.count()
    return CheckpointStore(LAYOUT, device_slots, host_checkpoints * BPC + extra_host_bytes, device=device,
                           keep_deepest=keep_deepest, clock=lambda: float(next(ticks)))


def test_layout():
    assert LAYOUT.bytes_per_checkpoint() == BPC == 328
    assert RecurrentLayout.of(state(0)) == LAYOUT
    assert RecurrentLayout(()).bytes_per_checkpoint() == 0
    with pytest.raises(TypeError, match=r"^RecurrentLayout entry must be \(tuple of int >= 0, torch.dtype\), "
                                        r"got \(\[2\], torch.float32\)$"):
        RecurrentLayout((([2], torch.float32),))
    with pytest.raises(TypeError, match="got \\(\\(2,\\), 'float32'\\)"):
        RecurrentLayout((((2,), "float32"),))


@pytest.mark.parametrize("device", DEVICES)
def test_save_copies_and_load_is_bit_exact_from_both_tiers(device):
    store = make(device_slots=1, host_checkpoints=1, device=device)
    root = Node()
    a, b = child(root, 10), child(root, 20)
    live = [t.to(device) for t in state(1)]
    # A non-contiguous source (transposed view of the conv state) is copied by value too.
    live[0] = live[0].t().contiguous().t()
    original = [t.clone() for t in live]
    ca = store.save(live, a)
    assert (ca, a.checkpoint, store.tier_of(ca)) == (0, 0, "device")
    for t in live:  # the live state keeps running: the checkpoint must not alias it
        t.add_(1)
    into = zeros()
    store.load(ca, into)
    assert_bit_equal(into, [t.cpu() for t in original])  # loads into CPU tensors from any device
    assert all(t.device.type == device for t in store.device_tensors)
    cb = store.save(state(2), b)  # device full: a (older) spills to the host tier
    assert (store.tier_of(ca), store.tier_of(cb)) == ("host", "device")
    live_again = [torch.zeros_like(t) for t in live]
    store.load(ca, live_again)  # from the host tier into live tensors on the device
    assert_bit_equal([t.cpu() for t in live_again], [t.cpu() for t in original])
    store.load(cb, into)
    assert_bit_equal(into, state(2))
    assert store.stats() == {"device_count": 1, "host_count": 1, "device_bytes_used": BPC,
                             "host_bytes_used": BPC, "capacity": 2, "saves": 2, "loads": 3,
                             "spills": 1, "drops": 0, "evictions": 0}
    assert [tuple(t.shape) for t in store.device_tensors] == [(1, 6, 3), (1, 2, 4, 4)] * 2
    assert store.pinned is (device == "cuda")  # host copies are pinned only for a CUDA device
    store.check_invariants()


def test_full_store_drops_lowest_value_and_clears_its_node():
    store = make(device_slots=2, host_checkpoints=1)
    root = Node()
    # Four separate paths, no checkpoint below any: all class 1, gain = depth (nothing above).
    x, y, z, w = (child(root, d) for d in (10, 20, 30, 40))
    cids = [store.save(state(i), n) for i, n in enumerate((x, y, z))]
    # Saving z spilled the device checkpoint with the smaller gain: x (10 < 20).
    assert [store.tier_of(c) for c in cids] == ["host", "device", "device"]
    store.load(cids[1], zeros())  # y used again: z is now the oldest device checkpoint...
    cw = store.save(state(3), w)
    # ...but y saves fewer tokens (20 < 30), so y is the device victim; against host x (gain 10), x
    # is worth less: x is dropped and y spilled.
    assert x.checkpoint is None and cids[0] not in store
    assert (store.tier_of(cids[1]), store.tier_of(cids[2]), store.tier_of(cw)) == ("host", "device", "device")
    into = zeros()
    store.load(cids[1], into)
    assert_bit_equal(into, state(1))
    assert store.stats() == {"device_count": 2, "host_count": 1, "device_bytes_used": 2 * BPC,
                             "host_bytes_used": BPC, "capacity": 3, "saves": 4, "loads": 2,
                             "spills": 2, "drops": 1, "evictions": 1}
    with pytest.raises(KeyError, match="unknown checkpoint id 0"):
        store.load(cids[0], into)
    store.check_invariants()


def test_device_victim_worth_less_than_every_host_checkpoint_is_dropped_not_spilled():
    store = make(device_slots=1, host_checkpoints=1)
    root = Node()
    old = child(root, 50)
    c_old = store.save(state(0), old)           # device
    a1, a2 = chain(root, 10, 20)
    c1 = store.save(state(1), a1)               # old spills to host
    c2 = store.save(state(2), a2)               # device victim a1; host full
    # a1 is not redundant with keep_deepest=2 (only a2 below), like `old`: both class 1. a1 saves 10
    # tokens, `old` 50: a1, although newer, is worth less than the only host checkpoint and is
    # dropped without a spill.
    assert c1 not in store and a1.checkpoint is None
    assert (store.tier_of(c_old), store.tier_of(c2)) == ("host", "device")
    assert store.stats()["spills"] == 1 and store.stats()["evictions"] == 1
    into = zeros()
    store.load(c_old, into)
    assert_bit_equal(into, state(0))
    store.check_invariants()


def test_two_threads_keep_their_deepest_checkpoints_across_tiers():
    """Thread B checkpoints 2 turns, then thread A checkpoints 5 deeper and deeper turns into a
    store of 5 (3 device + 2 host, keep_deepest=2). A's own shallow checkpoints, made redundant by
    its deeper ones, are spilled and dropped; B's two (older, but the deepest of B's path) survive."""
    store = make(device_slots=3, host_checkpoints=2)
    root = Node()
    system = child(root, 100)
    b1, b2 = chain(system, 200, 300)
    a = chain(system, 150, 250, 350, 450, 550)
    cb = [store.save(state(10 + i), n) for i, n in enumerate((b1, b2))]
    ca = [store.save(state(i), n) for i, n in enumerate(a)]
    # Class 0 = 2+ checkpoints below; gain = depth - depth of the next checkpointed ancestor
    # (system and root hold none); the clock ticks once per save, so last use = id.
    # save a1: device b1 (class 1, gain 200), b2 (1, 100), a0 (1 below: class 1, 150) -> b2 spilled.
    # save a2: device b1, a0 (class 0), a1 (1 below) -> a0 spilled (host: b2, a0).
    # save a3: device b1, a1 (class 0, 100), a2 -> a1; host full: b2 (class 1), a0 (0, 150) and a1
    #   (0, 100) -> a1 itself is dropped, not spilled.
    # save a4: device b1, a2 (class 0, 350 - 150 = 200), a3 (1 below) -> a2; host full: b2 (class 1),
    #   a0 (0, 150), a2 (0, 200) -> a0 dropped, a2 spilled.
    assert [n.checkpoint for n in (b1, b2)] == cb == [0, 1]
    assert [n.checkpoint for n in a] == [None, None, 4, 5, 6]
    assert {c: store.tier_of(c) for c in store.ids()} == {
        0: "device", 1: "host", 4: "host", 5: "device", 6: "device"}
    assert store.stats() == {"device_count": 3, "host_count": 2, "device_bytes_used": 3 * BPC,
                             "host_bytes_used": 2 * BPC, "capacity": 5, "saves": 7, "loads": 0,
                             "spills": 3, "drops": 2, "evictions": 2}
    into = zeros()
    for i, c in enumerate(cb):  # thread B comes back: both its checkpoints load exactly
        store.load(c, into)
        assert_bit_equal(into, state(10 + i))
    store.check_invariants()
    assert ca[:2] == [2, 3]


def test_locked_checkpoints_go_last():
    store = make(device_slots=2, host_checkpoints=0)
    root = Node()
    locked, free, new = child(root, 10), child(root, 20), child(root, 30)
    locked.lock_ref = 1
    c_locked = store.save(state(0), locked)
    c_free = store.save(state(1), free)
    store.save(state(2), new)
    assert c_locked in store and c_free not in store and free.checkpoint is None
    new.lock_ref = 1
    store.save(state(3), child(root, 40))  # only locked ones left: smaller gain (10 < 30) goes
    assert c_locked not in store and locked.checkpoint is None
    assert store.stats()["evictions"] == 2
    store.check_invariants()


def test_replacing_a_checkpoint_at_the_same_node_frees_the_old_one():
    store = make(device_slots=1, host_checkpoints=0)
    node = child(Node(), 10)
    first = store.save(state(0), node)
    second = store.save(state(1), node)  # capacity 1: no eviction, the old slot is reused
    assert (first, second, node.checkpoint, store.num_checkpoints) == (0, 1, 1, 1)
    assert first not in store and store.get_node(second) is node
    into = zeros()
    store.load(second, into)
    assert_bit_equal(into, state(1))
    stats = store.stats()
    assert (stats["saves"], stats["drops"], stats["evictions"]) == (2, 1, 0)
    store.check_invariants()


def test_drop_and_node_eviction():
    store = make(device_slots=1, host_checkpoints=1)
    root = Node()
    a, b = child(root, 10), child(root, 20)
    ca, cb = store.save(state(0), a), store.save(state(1), b)
    store.drop(ca)  # a host checkpoint
    assert a.checkpoint is None and ca not in store
    store.on_node_evicted(b)  # the radix tree evicts b
    assert b.checkpoint is None and store.num_checkpoints == 0
    store.on_node_evicted(a)  # no checkpoint: nothing happens
    with pytest.raises(KeyError, match="unknown checkpoint id 0"):
        store.drop(ca)
    with pytest.raises(KeyError, match="unknown checkpoint id 7"):
        store.get_node(7)
    assert store.stats() == {"device_count": 0, "host_count": 0, "device_bytes_used": 0,
                             "host_bytes_used": 0, "capacity": 2, "saves": 2, "loads": 0,
                             "spills": 1, "drops": 2, "evictions": 0}
    # Freed device slot and recycled host buffer are used again.
    c = [store.save(state(i), n) for i, n in enumerate((a, b))]
    assert [store.tier_of(x) for x in c] == ["host", "device"]
    store.check_invariants()


def test_capacity_zero_tiers():
    node = child(Node(), 10)
    none = make(device_slots=0, host_checkpoints=0, extra_host_bytes=BPC - 1)  # < one checkpoint
    assert (none.capacity, none.save(state(0), node), node.checkpoint) == (0, None, None)
    assert none.stats()["saves"] == 0
    host_only = make(device_slots=0, host_checkpoints=2)
    assert host_only.capacity == 2 and [tuple(t.shape) for t in host_only.device_tensors][0] == (0, 6, 3)
    nodes = [child(node, d) for d in (20, 30, 40)]
    cids = [host_only.save(state(i), n) for i, n in enumerate(nodes)]
    assert cids[0] not in host_only and [host_only.tier_of(c) for c in cids[1:]] == ["host", "host"]
    into = zeros()
    host_only.load(cids[2], into)
    assert_bit_equal(into, state(2))
    stats = host_only.stats()
    assert (stats["saves"], stats["spills"], stats["evictions"], stats["host_count"]) == (3, 0, 1, 2)
    device_only = make(device_slots=1, host_checkpoints=0)
    c1 = device_only.save(state(0), nodes[0])
    c2 = device_only.save(state(1), nodes[1])
    assert c1 not in device_only and device_only.tier_of(c2) == "device"
    for s in (host_only, device_only):
        s.check_invariants()
    empty = CheckpointStore(RecurrentLayout(()), 2, 1 << 20)  # attention-only model
    assert empty.capacity == 2 and empty.save([], node) == 0


def test_bad_input():
    store = make(device_slots=1, host_checkpoints=1)
    node = child(Node(), 10)
    live = state(0)
    with pytest.raises(ValueError, match=r"^CheckpointStore.save: expected 4 recurrent tensors, got 3$"):
        store.save(live[:3], node)
    bad = live[:1] + [live[1].double()] + live[2:]
    with pytest.raises(ValueError, match=r"^CheckpointStore.save: tensor 1 must be \(2, 4, 4\) "
                                         r"torch.float32, "
                                         r"got \(2, 4, 4\) torch.float64$"):
        store.save(bad, node)
    assert node.checkpoint is None and store.num_checkpoints == 0
    cid = store.save(live, node)
    with pytest.raises(ValueError, match=r"^CheckpointStore.load: tensor 0 must be \(6, 3\) torch.bfloat16, "
                                         r"got \(3, 6\) torch.bfloat16$"):
        store.load(cid, [live[0].t()] + live[1:])
    with pytest.raises(ValueError, match=r"^CheckpointStore device_slots must be an int >= 0, got -1$"):
        CheckpointStore(LAYOUT, -1, 0)
    with pytest.raises(ValueError, match=r"^CheckpointStore keep_deepest must be an int >= 0, got 1.5$"):
        CheckpointStore(LAYOUT, 1, 0, keep_deepest=1.5)
