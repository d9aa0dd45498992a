"""The start-up memory plan: its arithmetic for hand-chosen memories (a CPU device, a fake CUDA
device), the refusal of explicit budgets that do not fit (exact line, exit 2, before loading),
the readers (meminfo, cgroup, safetensors headers) and the defaults serve now takes from it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from safetensors import safe_open

from freetoken.cli import build_parser
from freetoken.engine import memory_plan as mp
from freetoken.engine.memory_plan import (
    Budgets,
    DeviceMemory,
    HostMemory,
    PlanError,
    WeightBytes,
    checkpoint_weight_bytes,
    host_memory,
    plan_memory,
    read_meminfo,
)
from freetoken.launch import cache_settings, memory_plan, serve

GiB = 1 << 30
MiB = 1 << 20


def test_cpu_device_counts_host_memory_once():
    # 40 GiB total -> 4 GiB reserve; 24 - 8 (weights) - 4 = 12 GiB pool; a quarter each
    plan = plan_memory(HostMemory(total=40 * GiB, available=24 * GiB), None,
                       WeightBytes(experts=6 * GiB, other=2 * GiB))
    assert (plan.device, plan.weights_device, plan.weights_host, plan.expert_banks) == \
        ("cpu", 8 * GiB, 0, 0)
    assert (plan.reserve_host, plan.reserve_device) == (4 * GiB, 0)
    assert (plan.kv_cache_bytes, plan.checkpoint_host_bytes) == (3 * GiB, 3 * GiB)
    assert (plan.host_left, plan.device_left, plan.expert_cache_bytes) == (6 * GiB, 6 * GiB, 0)
    assert not plan.kv_explicit and not plan.checkpoint_host_explicit


def test_cpu_device_explicit_budgets_are_taken_first():
    plan = plan_memory(HostMemory(total=40 * GiB, available=24 * GiB), None,
                       WeightBytes(experts=6 * GiB, other=2 * GiB),
                       Budgets(kv_cache_bytes=4 * GiB))
    # the 12 GiB pool less the explicit 4 GiB: 8 GiB, a quarter of it for checkpoints
    assert (plan.kv_cache_bytes, plan.checkpoint_host_bytes, plan.host_left) == \
        (4 * GiB, 2 * GiB, 6 * GiB)
    assert plan.kv_explicit


def test_small_machine_reserve_is_at_least_one_gib():
    plan = plan_memory(HostMemory(total=4 * GiB, available=3 * GiB), None,
                       WeightBytes(experts=0, other=1 * GiB))
    assert plan.reserve_host == 1 * GiB
    assert (plan.kv_cache_bytes, plan.checkpoint_host_bytes, plan.host_left) == \
        (256 * MiB, 256 * MiB, 512 * MiB)


def test_weights_larger_than_memory_leave_zero_defaults():
    plan = plan_memory(HostMemory(total=10 * GiB, available=5 * GiB), None,
                       WeightBytes(experts=8 * GiB, other=0))
    assert (plan.kv_cache_bytes, plan.checkpoint_host_bytes, plan.host_left) == (0, 0, -4 * GiB)
    assert plan.table()[-1] == "  left         host                -4.00 GiB"


def test_fake_cuda_device_splits_device_and_host():
    # device: 18 free - 4 (non-expert) - 2 reserve = 12 GiB: KV 3, expert cache the other 9
    # host: 47 available - 30 (banks) - 5 reserve = 12 GiB: checkpoints 3
    plan = plan_memory(HostMemory(total=50 * GiB, available=47 * GiB),
                       DeviceMemory(total=20 * GiB, free=18 * GiB),
                       WeightBytes(experts=30 * GiB, other=4 * GiB), device_name="cuda:0")
    assert (plan.weights_device, plan.expert_banks, plan.reserve_device, plan.reserve_host) == \
        (4 * GiB, 30 * GiB, 2 * GiB, 5 * GiB)
    assert (plan.kv_cache_bytes, plan.expert_cache_bytes, plan.device_left) == \
        (3 * GiB, 9 * GiB, 0)
    assert (plan.checkpoint_host_bytes, plan.host_left) == (3 * GiB, 9 * GiB)


def test_fake_cuda_device_keeps_experts_resident_when_they_fit():
    plan = plan_memory(HostMemory(total=50 * GiB, available=47 * GiB),
                       DeviceMemory(total=20 * GiB, free=18 * GiB),
                       WeightBytes(experts=6 * GiB, other=2 * GiB), device_name="cuda:0")
    # 18 - 8 - 2 = 8 GiB: KV 2; no banks, no expert cache; host 47 - 5 = 42: checkpoints 10.5
    assert (plan.weights_device, plan.expert_banks, plan.expert_cache_bytes) == (8 * GiB, 0, 0)
    assert (plan.kv_cache_bytes, plan.device_left) == (2 * GiB, 6 * GiB)
    assert (plan.checkpoint_host_bytes, plan.host_left) == (10 * GiB + 512 * MiB,
                                                            31 * GiB + 512 * MiB)


def test_fake_cuda_table():
    plan = plan_memory(HostMemory(total=50 * GiB, available=47 * GiB),
                       DeviceMemory(total=20 * GiB, free=18 * GiB),
                       WeightBytes(experts=30 * GiB, other=4 * GiB),
                       Budgets(checkpoint_host_bytes=1 * GiB), device_name="cuda:0")
    assert plan.table() == [
        "memory plan:",
        "  available    host                47.00 GiB  of 50.00 GiB",
        "  available    cuda:0              18.00 GiB  of 20.00 GiB",
        "  weights      cuda:0               4.00 GiB  non-expert tensors",
        "  expert banks host                30.00 GiB  routed experts",
        "  expert cache cuda:0               9.00 GiB  up to: the rest",
        "  KV pool      cuda:0               3.00 GiB  cap: 25% of the pool",
        "  checkpoints  cuda:0                      -  8 slots",
        "  checkpoints  host                 1.00 GiB  --state-checkpoint-bytes",
        "  reserve      host                 5.00 GiB  max(10% of total, 1 GiB)",
        "  reserve      cuda:0               2.00 GiB  max(10% of total, 1 GiB)",
        "  left         host                11.00 GiB",
        "  left         cuda:0                    0 B",
    ]


@pytest.mark.parametrize(("budgets", "device", "message"), [
    (Budgets(kv_cache_bytes=64 * GiB), None,
     "--kv-cache-bytes 64.00 GiB does not fit: 12.00 GiB available after 8.00 GiB of weights "
     "and a 4.00 GiB reserve"),
    (Budgets(kv_cache_bytes=8 * GiB, checkpoint_host_bytes=5 * GiB), None,
     "--state-checkpoint-bytes 5.00 GiB does not fit: 4.00 GiB available after 8.00 GiB of "
     "weights, a 4.00 GiB reserve and 8.00 GiB of --kv-cache-bytes"),
    (Budgets(kv_cache_bytes=13 * GiB), DeviceMemory(total=20 * GiB, free=20 * GiB),
     "--kv-cache-bytes 13.00 GiB does not fit: 12.00 GiB available after 6.00 GiB of weights "
     "and a 2.00 GiB reserve"),
    (Budgets(checkpoint_host_bytes=32 * GiB), DeviceMemory(total=20 * GiB, free=20 * GiB),
     "--state-checkpoint-bytes 32.00 GiB does not fit: 22.00 GiB available after 2.00 GiB of "
     "weights and a 4.00 GiB reserve"),
])
def test_explicit_budgets_that_do_not_fit_are_refused(budgets, device, message):
    with pytest.raises(PlanError) as info:
        plan_memory(HostMemory(total=40 * GiB, available=28 * GiB) if device else
                    HostMemory(total=40 * GiB, available=24 * GiB), device,
                    WeightBytes(experts=2 * GiB, other=6 * GiB) if device else
                    WeightBytes(experts=6 * GiB, other=2 * GiB), budgets,
                    experts_resident=False, device_name="cuda:0")
    assert str(info.value) == message


def test_meminfo_and_cgroup_readers(tmp_path: Path):
    text = "MemTotal:       24000000 kB\nMemFree:  1000 kB\nMemAvailable:   20000000 kB\n"
    info = read_meminfo(text)
    assert (info["MemTotal"], info["MemAvailable"]) == (24000000 * 1024, 20000000 * 1024)
    no_cgroup = host_memory(lambda: info, cgroup=tmp_path / "absent")
    assert no_cgroup == HostMemory(total=24000000 * 1024, available=20000000 * 1024)
    (tmp_path / "memory.max").write_text("8589934592\n")
    (tmp_path / "memory.current").write_text("2147483648\n")
    assert host_memory(lambda: info, cgroup=tmp_path) == HostMemory(total=8 * GiB,
                                                                     available=6 * GiB)
    (tmp_path / "memory.max").write_text("max\n")
    assert host_memory(lambda: info, cgroup=tmp_path) == no_cgroup


def test_weight_bytes_from_headers_at_the_compute_width(tiny_checkpoint):
    path = tiny_checkpoint("qwen3_moe")
    experts = other = 0
    with safe_open(path / "model.safetensors", framework="pt") as f:
        for name in f.keys():
            n = math.prod(f.get_slice(name).get_shape())
            if ".experts." in name:
                experts += n
            else:
                other += n
    assert experts > 0 and other > 0
    assert checkpoint_weight_bytes(path, 4) == WeightBytes(experts=4 * experts, other=4 * other)
    assert checkpoint_weight_bytes(path, 2) == WeightBytes(experts=2 * experts, other=2 * other)


FAKE_MEMINFO = {"MemTotal": 40 * GiB, "MemAvailable": 24 * GiB}


def _serve_args(path: Path, *flags: str):
    return build_parser().parse_args(["serve", "--model", str(path), "--port", "0", *flags])


def test_serve_defaults_come_from_the_plan(tiny_checkpoint):
    args = _serve_args(tiny_checkpoint("qwen3_next"), "--dtype", "float32")
    plan = memory_plan(args, args.model, meminfo=lambda: FAKE_MEMINFO)
    weights = checkpoint_weight_bytes(args.model, 4).total
    pool = 24 * GiB - weights - 4 * GiB
    assert (plan.kv_cache_bytes, plan.checkpoint_host_bytes) == (pool // 4, pool // 4)
    cache = cache_settings(args, plan)
    assert (cache.kv_cache_bytes, cache.kv_budget_bytes, cache.checkpoint_host_bytes) == \
        (None, pool // 4, pool // 4)
    assert cache.checkpoint_host_floor == plan.reserve_host == 4 * GiB  # the tier's watcher
    explicit = _serve_args(args.model, "--state-checkpoint-bytes", "0")
    assert cache_settings(explicit, plan).checkpoint_host_bytes == 0


def test_serve_refuses_a_budget_that_does_not_fit_before_loading(tiny_checkpoint, monkeypatch,
                                                                 capsys):
    path = tiny_checkpoint("qwen3_next")
    monkeypatch.setattr(mp, "read_meminfo", lambda: FAKE_MEMINFO)
    monkeypatch.setattr(mp, "_read_int", lambda _path: None)  # no cgroup limit here
    weights = checkpoint_weight_bytes(path, 2).total  # --dtype auto: stored bf16
    assert serve(_serve_args(path, "--kv-cache-bytes", "64GiB")) == 2
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"[freetoken] loading {path} (bfloat16, cpu)",
        f"[freetoken] error: --kv-cache-bytes 64.00 GiB does not fit: "
        f"{mp.format_bytes(20 * GiB - weights)} available after {mp.format_bytes(weights)} of "
        "weights and a 4.00 GiB reserve",
    ]


def test_the_plan_caps_the_default_expert_cache_on_cuda_only():
    from freetoken.launch import moe_for_plan
    from freetoken.offload.backend import MoeConfig

    cuda = plan_memory(HostMemory(total=50 * GiB, available=47 * GiB),
                       DeviceMemory(total=20 * GiB, free=18 * GiB),
                       WeightBytes(experts=30 * GiB, other=4 * GiB), device_name="cuda:0")
    cpu = plan_memory(HostMemory(total=40 * GiB, available=24 * GiB), None,
                      WeightBytes(experts=6 * GiB, other=2 * GiB))
    moe = MoeConfig(backend="hybrid")
    assert moe_for_plan(moe, cuda) == MoeConfig(backend="hybrid", default_cache_bytes=9 * GiB)
    assert moe_for_plan(moe, cpu) is moe and moe_for_plan(moe, None) is moe
