"""The ``small`` qwen3_next preset (12 MoE layers x 64 experts, top-8) with offloaded experts:
64 greedy tokens identical to ``--moe-backend resident`` for every backend at a quarter cache, and
across a live resize (issue 3 acceptance). Slow: generates a 1.2 GB checkpoint on first use."""

from __future__ import annotations

import pytest

from freetoken.models.registry import load_model
from freetoken.models.tiny import cached_tiny
from freetoken.offload.backend import MoeConfig
from tests.offload.test_offload_model import greedy

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def small():
    path = cached_tiny("qwen3_next", "small")
    return path, greedy(load_model(path))


@pytest.mark.parametrize("backend", ["offload", "cpu", "hybrid"])
def test_small_model_backends_generate_resident_tokens(small, backend):
    path, expected = small
    model = load_model(path, moe=MoeConfig(backend=backend, cache="0.25"))
    runtime = model.moe_runtime
    slot = runtime.cache.slot_bytes

    def on_step(i, rt):
        if i == 32:
            rt.resize_expert_cache(400 * slot)

    assert greedy(model, on_step=on_step) == expected
    assert runtime.cache.num_slots == 400
    runtime.cache.check_invariants()
