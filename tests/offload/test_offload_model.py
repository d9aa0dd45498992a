"""Whole tiny models with offloaded experts generate exactly what the resident model generates
(issue 3 acceptance): 64 greedy tokens identical for every backend and cache size, across a live
resize in the middle of a generation, and with a one-slot cache that evicts every step."""

from __future__ import annotations

import os

import pytest
import torch

from freetoken.models.registry import load_model
from freetoken.offload.backend import MoeConfig

# cpu here; evals/gpu_check.sh reruns these tests with cuda.
DEVICE = os.environ.get("FREETOKEN_TEST_DEVICE", "cpu")
PROMPT = torch.tensor([5, 17, 300, 42, 8000, 12, 99, 1000, 7, 7, 2048, 31], dtype=torch.long)
NEW_TOKENS = 64


def greedy(model, steps: int = NEW_TOKENS, on_step=None) -> list[int]:
    """64 greedy tokens after PROMPT, running the runtime's step boundaries like the runner."""
    runtime = model.moe_runtime
    state = model.new_state()
    out = []
    ids = PROMPT.to(DEVICE)
    for i in range(steps):
        if on_step is not None:
            on_step(i, runtime)
        if runtime is not None:
            runtime.begin_step()
        logits = model(ids, state)
        if runtime is not None:
            runtime.end_step()
        token = int(logits[-1].argmax())
        out.append(token)
        ids = torch.tensor([token], device=DEVICE)
    return out


@pytest.fixture(scope="module")
def resident_tokens(tiny_checkpoint):
    cache = {}

    def get(arch):
        if arch not in cache:
            cache[arch] = greedy(load_model(tiny_checkpoint(arch), device=DEVICE))
        return cache[arch]

    return get


@pytest.mark.parametrize("arch", ["qwen3_next", "qwen3_moe", "qwen3_5_moe", "glm4_moe", "gpt_oss"])
@pytest.mark.parametrize("backend", ["offload", "cpu", "hybrid"])
@pytest.mark.parametrize("cache", ["1", "0.25", "1.0"])
def test_backend_generates_resident_tokens(tiny_checkpoint, resident_tokens, arch, backend, cache):
    model = load_model(tiny_checkpoint(arch), moe=MoeConfig(backend=backend, cache=cache),
                       device=DEVICE)
    runtime = model.moe_runtime
    assert runtime is not None and runtime.backend == backend
    assert greedy(model) == resident_tokens(arch)
    runtime.cache.check_invariants()
    s = runtime.stats()
    routed = sum(l.hits + l.misses for l in s.layers)
    assert routed > 0
    if cache == "1.0":
        assert sum(l.misses for l in s.layers) == 0  # the preload holds every expert
    if backend == "cpu":
        assert sum(l.fills for l in s.layers) == 0
    if cache == "1" and backend == "offload":
        assert sum(l.evictions for l in s.layers) > NEW_TOKENS  # evicts on (almost) every step


@pytest.mark.parametrize("arch", ["qwen3_next", "qwen3_moe", "qwen3_5_moe", "glm4_moe", "gpt_oss"])
def test_every_cpu_isa_generates_resident_tokens(tiny_checkpoint, resident_tokens, arch,
                                                 every_cpu_isa):
    """``cpu`` with a one-slot cache runs almost every expert on the CPU kernel: once per ISA
    variant this CPU supports, the 64 tokens are the resident ones."""
    model = load_model(tiny_checkpoint(arch), moe=MoeConfig(backend="cpu", cache="1"),
                       device=DEVICE)
    assert greedy(model) == resident_tokens(arch)
    s = model.moe_runtime.stats()
    assert sum(l.cpu_experts for l in s.layers) > NEW_TOKENS


@pytest.mark.parametrize("backend", ["offload", "hybrid"])
def test_live_resize_mid_generation(tiny_checkpoint, resident_tokens, backend):
    model = load_model(tiny_checkpoint("qwen3_next"), moe=MoeConfig(backend=backend, cache="8"),
                       device=DEVICE)
    runtime = model.moe_runtime
    slot = runtime.cache.slot_bytes
    sizes = {10: 3 * slot, 25: 40 * slot, 40: 1, 50: 10**12}
    seen = []

    def on_step(i, rt):
        if i in sizes:
            rt.resize_expert_cache(sizes[i])
        seen.append(rt.cache.num_slots)

    assert greedy(model, on_step=on_step) == resident_tokens("qwen3_next")
    # each resize landed at the next step boundary
    assert seen[10] == 8 and seen[11] == 3 and seen[26] == 40 and seen[41] == 1
    assert seen[51] == runtime.banks.num_ids
    runtime.cache.check_invariants()


def test_auto_on_cpu_is_resident(tiny_checkpoint):
    model = load_model(tiny_checkpoint("qwen3_next"), moe=MoeConfig(backend="auto"))
    assert model.moe_runtime is None


def test_banks_hold_the_checkpoint_experts(tiny_checkpoint):
    resident = load_model(tiny_checkpoint("qwen3_moe"))
    model = load_model(tiny_checkpoint("qwen3_moe"), moe=MoeConfig(backend="offload"))
    banks = model.moe_runtime.banks
    assert banks.dtype == torch.bfloat16  # stored bf16: kept bf16 (lossless, half the bytes)
    assert not banks.pinned  # cache on the CPU: nothing to pin for
    for l, block in enumerate(resident.moe_blocks()):
        e = block.num_experts
        assert torch.equal(banks.gate_up[l * e:(l + 1) * e].float(), block.experts.gate_up)
        assert torch.equal(banks.down[l * e:(l + 1) * e].float(), block.experts.down)
    assert not any("experts" in name for name, _ in model.named_parameters())


@pytest.mark.parametrize("fmt", ["q4g", "mxfp4"])
def test_4bit_banks_generate_the_dequantised_resident_tokens(tiny_checkpoint, fmt):
    """With ``--moe-expert-format`` every backend serves the dequantised experts: 64 greedy tokens
    equal those of the resident model whose expert weights are replaced by the same values."""
    path = tiny_checkpoint("qwen3_next")
    outputs = {}
    for backend in ("offload", "cpu", "hybrid"):
        model = load_model(path, moe=MoeConfig(backend=backend, cache="0.25", expert_format=fmt),
                           device=DEVICE)
        banks = model.moe_runtime.banks
        assert banks.format == fmt and banks.gate_up is None
        outputs[backend] = greedy(model)
    gate_up, down = banks.kernel_view().dequantize()
    resident = load_model(path, device=DEVICE)
    for l, block in enumerate(resident.moe_blocks()):
        e = block.num_experts
        block.experts.gate_up.copy_(gate_up[l * e:(l + 1) * e])
        block.experts.down.copy_(down[l * e:(l + 1) * e])
    expected = greedy(resident)
    assert outputs == {"offload": expected, "cpu": expected, "hybrid": expected}
    # resident on a CPU device: the experts stay in fmt, computed by the kernel, fused decode
    # block and decode stack included; off the CPU no kernel reads them
    resident_fmt = MoeConfig(backend="resident", expert_format=fmt)
    if torch.device(DEVICE).type != "cpu":
        with pytest.raises(ValueError, match=f"--moe-expert-format {fmt} needs host expert banks"):
            load_model(path, moe=resident_fmt, device=DEVICE)
        return
    banked = load_model(path, moe=resident_fmt, device=DEVICE)
    experts = banked.moe_blocks()[0].experts
    assert type(experts).__name__ == "BankExperts" and experts.banks.format == fmt
    assert greedy(banked) == expected


def test_memory_floor_watcher_shrinks_and_regrows_mid_generation(tiny_checkpoint, resident_tokens):
    """``--moe-memory-floor`` builds a watcher on the device's real free-memory probe; with the
    probe scripted to run short of the floor and recover, the cache shrinks to one slot and grows
    back mid-generation, and the 64 tokens stay the resident ones."""
    model = load_model(tiny_checkpoint("qwen3_next"), device=DEVICE,
                       moe=MoeConfig(backend="hybrid", cache="0.5", memory_floor="64MiB"))
    runtime = model.moe_runtime
    watcher = runtime.watcher
    assert watcher is not None and watcher.floor == 64 * 2**20
    assert watcher.probe() > 0  # the real probe (MemAvailable on cpu, mem_get_info on cuda)
    requested = runtime.requested_slots
    assert runtime.stats().memory_floor_bytes == 64 * 2**20
    short, plenty = watcher.floor - 10**12, watcher.floor + 10**12
    frees = iter([plenty] * 10 + [short] * 20 + [plenty] * 100)
    watcher.probe = lambda: next(frees)
    watcher.check_every = 1
    sizes = []
    assert greedy(model, on_step=lambda i, rt: sizes.append(rt.cache.num_slots)) == \
        resident_tokens("qwen3_next")
    assert sizes[10] == requested and sizes[11] == sizes[30] == 1 and sizes[31] == requested
    assert sizes[-1] == requested
    assert (watcher.shrinks, watcher.grows) == (1, 1)
    runtime.cache.check_invariants()
