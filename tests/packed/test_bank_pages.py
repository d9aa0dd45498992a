"""Host expert banks are filled on small pages and end on 2 MiB pages: the ``huge pages`` load
stage covers their whole 2 MiB pages, and /proc/self/smaps shows them collapsed (where the
kernel has MADV_COLLAPSE and THP is not off)."""

from __future__ import annotations

import pytest

from freetoken.huge_pages import huge_spans
from freetoken.models.load_progress import LoadStep
from freetoken.models.registry import load_model
from freetoken.offload.backend import MoeConfig
from freetoken.packed.banks import bank_tensors
from tests.unit.test_huge_pages import _anon_huge_bytes, _collapse_supported


@pytest.mark.parametrize("source", ["packed", "safetensors"])
def test_loaded_banks_end_on_huge_pages(packed_pair, source) -> None:
    src, dst = packed_pair("qwen3_moe-bf16")
    steps: list[LoadStep] = []
    model = load_model(dst if source == "packed" else src,
                       moe=MoeConfig(backend="offload", cache="2"), progress=steps.append)
    spans = huge_spans(bank_tensors(model.moe_runtime.banks).values())
    total = sum(size for _address, size in spans)
    assert total > 0
    stage = [s for s in steps if s.stage == "huge pages"]
    assert stage[0] == LoadStep(0, total, 1, 1, False, "huge pages")
    assert stage[-1] == LoadStep(total, total, 1, 1, True, "huge pages")
    assert [s.done_bytes for s in stage] == sorted(s.done_bytes for s in stage)
    if _collapse_supported():  # the kernel may lack a free 2 MiB page now and then
        assert sum(_anon_huge_bytes(address, size) for address, size in spans) >= total // 2
