"""The memory watcher shrinks the expert cache under memory pressure and regrows it (issue 3).

A scripted probe stands for the device's free memory; the runtime and cache are real (the
"device" is the one the exactness tests use), so resizes really reallocate the pool and the
layer output is checked against the dense reference across them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from freetoken.offload.split import MissSplit
from freetoken.offload.watcher import MemoryWatcher, _mem_available, free_memory_probe
from tests.offload.test_runtime_exactness import (
    DEVICE,
    check_fp32,
    dense,
    make_banks,
    make_runtime,
    routing,
)


class Probe:
    """Returns the scripted free bytes, one value per call (the last one repeats)."""

    def __init__(self, *values: int) -> None:
        self.values = list(values)
        self.calls = 0

    def __call__(self) -> int:
        self.calls += 1
        return self.values.pop(0) if len(self.values) > 1 else self.values[0]


def setup(slots=12, floor_slots=4, check_every=1, **kw):
    banks = make_banks()
    runtime = make_runtime(banks, slots, MissSplit("split", 1.0))
    slot = runtime.cache.slot_bytes
    return banks, runtime, slot


def test_shrinks_by_the_deficit_in_whole_slots_and_keeps_best_residents():
    banks, runtime, slot = setup()
    x, ids, w = routing(5, seed=1)
    runtime.begin_step()
    runtime.forward(0, x, ids, w)  # fills some experts; they become the best-scored residents
    runtime.end_step()
    held = set(runtime.cache.resident_ids().tolist())
    floor = 10 * slot
    # 2.5 slots short of the floor -> 3 slots fewer
    watcher = MemoryWatcher(runtime, floor, Probe(floor - 5 * slot // 2), check_every=1)
    runtime.watcher = watcher
    runtime.begin_step()
    assert runtime.cache.num_slots == 12 - 3
    assert watcher.shrinks == 1 and watcher.grows == 0
    assert set(runtime.cache.resident_ids().tolist()) <= held
    runtime.cache.check_invariants()
    # still exact after the shrink
    out = runtime.forward(0, x, ids, w)
    check_fp32(out, dense(banks, 0, x, ids, w))
    runtime.end_step()


def test_never_below_min_slots_and_no_resize_when_free_is_between_floor_and_headroom():
    _banks, runtime, slot = setup()
    floor = 10 * slot
    watcher = MemoryWatcher(runtime, floor, Probe(0, floor + slot // 2), check_every=1,
                            min_slots=2)
    watcher.check()
    assert runtime.cache.num_slots == 2
    # back above the floor but within the headroom (one slot + 10% of the floor): no regrow
    assert watcher.check() is None
    assert runtime.cache.num_slots == 2 and watcher.grows == 0


def test_regrows_to_the_requested_size_not_beyond():
    _banks, runtime, slot = setup()
    floor = 8 * slot
    headroom = slot
    probe = Probe(floor - 6 * slot, floor + headroom + 3 * slot, floor + headroom + 100 * slot)
    watcher = MemoryWatcher(runtime, floor, probe, check_every=1, headroom_bytes=headroom)
    watcher.check()
    assert runtime.cache.num_slots == 6
    watcher.check()  # 3 slots of spare memory -> +3
    assert runtime.cache.num_slots == 9
    watcher.check()  # plenty: back to the requested 12, not more
    assert runtime.cache.num_slots == 12 and watcher.grows == 2
    assert watcher.check() is None


def test_admin_resize_sets_the_size_the_watcher_grows_back_to():
    _banks, runtime, slot = setup()
    runtime.resize_now(5 * slot)
    assert runtime.requested_slots == 5
    floor = 4 * slot
    watcher = MemoryWatcher(runtime, floor, Probe(floor - 2 * slot, 10**15), check_every=1)
    watcher.check()
    assert runtime.cache.num_slots == 3
    watcher.check()
    assert runtime.cache.num_slots == 5


def test_checks_only_every_n_steps_and_calls_release_after_a_resize():
    _banks, runtime, slot = setup()
    released = []
    probe = Probe(0)
    watcher = MemoryWatcher(runtime, 4 * slot, probe, check_every=3,
                            release=lambda: released.append(True))
    runtime.watcher = watcher
    for _ in range(7):
        runtime.begin_step()
        runtime.end_step()
    assert probe.calls == 3  # steps 1, 4, 7
    assert watcher.shrinks == 3 and len(released) == 3
    assert runtime.cache.num_slots == 1  # 12 -> 8 -> 4 -> max(1, 0)


@pytest.mark.usefixtures("every_cpu_isa")
def test_outputs_stay_exact_across_watcher_resizes_under_eviction():
    banks, runtime, slot = setup(slots=6)
    floor = 6 * slot
    frees = [floor - 3 * slot, floor + 10 * slot, floor - 4 * slot, floor + 10 * slot] * 3
    runtime.watcher = MemoryWatcher(runtime, floor, Probe(*frees), check_every=1,
                                    headroom_bytes=slot)
    for step in range(12):
        runtime.begin_step()
        for layer in (0, 1):
            x, ids, w = routing(3, seed=100 + 2 * step + layer)
            check_fp32(runtime.forward(layer, x, ids, w), dense(banks, layer, x, ids, w))
        runtime.end_step()
        runtime.cache.check_invariants()
    assert runtime.watcher.shrinks >= 3 and runtime.watcher.grows >= 3


def test_low_peak_resize_equals_device_to_device_resize():
    banks = make_banks()
    caches = []
    for reload in (False, True):
        runtime = make_runtime(banks, 10, MissSplit("split", 1.0))
        x, ids, w = routing(6, seed=7)
        runtime.forward(0, x, ids, w)
        runtime.forward(1, x, ids, w)
        runtime.cache.resize(4, reload=reload)
        caches.append(runtime.cache)
    a, b = caches
    assert torch.equal(a.id_of, b.id_of) and torch.equal(a.slot_of, b.slot_of)
    assert torch.equal(a.gate_up, b.gate_up) and torch.equal(a.down, b.down)


def test_bad_arguments():
    _banks, runtime, _slot = setup()
    with pytest.raises(ValueError, match="memory floor must be a positive number of bytes, got 0"):
        MemoryWatcher(runtime, 0, Probe(0))
    with pytest.raises(ValueError, match="check_every and min_slots must be >= 1"):
        MemoryWatcher(runtime, 1, Probe(0), check_every=0)


def test_meminfo_probe(tmp_path: Path):
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   12345 kB\n")
    assert _mem_available(f) == 12345 * 1024
    f.write_text("MemTotal: 1 kB\n")
    with pytest.raises(ValueError, match="has no MemAvailable line"):
        _mem_available(f)
    probe = free_memory_probe(DEVICE)
    if DEVICE.type == "cpu" and Path("/proc/meminfo").is_file():
        assert probe is not None and probe() > 0
    assert free_memory_probe("meta") is None


def test_a_floor_above_the_device_memory_is_logged_at_load(caplog):
    from freetoken.offload.loading import memory_watcher
    from freetoken.offload.watcher import total_memory

    _banks, runtime, _slot = setup()
    total = total_memory(DEVICE)
    assert total is not None and total > 2**20
    with caplog.at_level("WARNING", logger="freetoken.offload"):
        watcher = memory_watcher(runtime, total + 1, DEVICE)
    assert watcher.floor == total + 1
    assert "is not below the" in caplog.text and "the expert cache will stay at its minimum" \
        in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="freetoken.offload"):
        memory_watcher(runtime, 2**20, DEVICE)
    assert caplog.text == ""
