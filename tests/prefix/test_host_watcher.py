"""The host checkpoint tier shrinks when host memory falls below the floor (an injected
``MemAvailable`` reader and clock), evicting least recently used checkpoints, and regrows toward
its requested budget once memory is back; the engine checks it before its steps."""

from __future__ import annotations

import itertools

import pytest

from freetoken.prefix.host_watcher import HostTierWatcher
from tests.prefix.engine_helpers import agent_turns, make_engine, render, serve
from tests.prefix.stand_ins import Node
from tests.prefix.test_checkpoints import BPC, make, state

FLOOR = 10_000


class Fake:
    """A settable ``MemAvailable`` reader and clock that count their reads."""

    def __init__(self, available: int) -> None:
        self.available, self.now, self.reads = available, 0.0, 0

    def probe(self) -> int:
        self.reads += 1
        return self.available


def four_host_checkpoints():
    """A store with a 4-checkpoint host tier (no device slots), full, on four equal-value paths;
    the first one saved is the most recently used."""
    store = make(device_slots=0, host_checkpoints=4)
    root = Node()
    nodes = [Node(parent=root, depth=10) for _ in range(4)]
    root.children.update(enumerate(nodes))
    cids = [store.save(state(i), n) for i, n in enumerate(nodes)]
    store.touch(cids[0])
    return store, nodes, cids


def test_below_the_floor_the_tier_shrinks_lru_first_then_regrows():
    store, nodes, cids = four_host_checkpoints()
    fake = Fake(available=FLOOR - 2 * BPC - 1)  # a deficit of two checkpoints and a byte
    watcher = HostTierWatcher(store, FLOOR, fake.probe, interval_s=2.0, clock=lambda: fake.now)
    assert watcher.check() == 4 * BPC - 2 * BPC - 1
    assert (store.host_bytes, store.host_capacity, store.ids()) == (2 * BPC - 1, 1, [cids[0]])
    assert [n.checkpoint for n in nodes] == [cids[0], None, None, None]
    assert (watcher.shrinks, watcher.evicted, store.stats()["evictions"]) == (1, 3, 3)
    store.check_invariants()

    fake.now, fake.available = 1.0, 0  # within the interval: memory is not read
    assert watcher.check() is None and fake.reads == 1
    fake.now, fake.available = 2.0, FLOOR + FLOOR // 10 + BPC  # spare: one checkpoint
    assert watcher.check() == 3 * BPC - 1 and store.host_capacity == 2
    fake.now, fake.available = 4.0, 10**9
    assert watcher.check() == 4 * BPC == watcher.requested
    fake.now = 6.0
    assert watcher.check() is None  # at its requested budget: nothing to do
    assert (watcher.shrinks, watcher.grows, fake.reads) == (1, 2, 4)
    store.check_invariants()


def test_above_the_floor_nothing_changes_and_an_empty_tier_shrinks_to_zero():
    store, _, cids = four_host_checkpoints()
    fake = Fake(available=FLOOR)
    watcher = HostTierWatcher(store, FLOOR, fake.probe, clock=lambda: fake.now)
    assert watcher.check() is None and store.ids() == sorted(cids)
    fake.now, fake.available = 10.0, 1
    assert watcher.check() == 0 and store.ids() == [] and store.host_capacity == 0
    store.check_invariants()
    with pytest.raises(ValueError, match="floor must be a positive number of bytes, got 0"):
        HostTierWatcher(store, 0, fake.probe)


def test_the_engine_checks_the_watcher_before_its_steps():
    engine = make_engine("qwen3_next", checkpoint_slots=0, checkpoint_host_bytes=1 << 30,
                         checkpoint_host_floor=FLOOR)
    watcher, store = engine.host_watcher, engine.prefix.store
    assert watcher is not None and watcher.floor == FLOOR
    fake = Fake(available=10**12)
    ticks = itertools.count()
    watcher.probe, watcher.clock = fake.probe, lambda: float(next(ticks)) * 10
    _, prompt = render("qwen3_next", agent_turns(2))
    serve(engine, prompt, key=1)
    held = store.num_in("host")
    assert held >= 1 and store.host_bytes == 1 << 30
    bpc = store.layout.bytes_per_checkpoint()
    fake.available = FLOOR - bpc  # a deficit of one checkpoint, read before the next step
    assert engine.step() is False  # idle: the check alone
    assert (watcher.shrinks, watcher.evicted) == (1, 1)
    assert (store.host_bytes, store.num_in("host")) == ((held - 1) * bpc, held - 1)
    store.check_invariants()
    assert make_engine("qwen3_next").host_watcher is None  # no floor: no watcher
