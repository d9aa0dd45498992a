"""Host expert banks are filled on small pages and end on 2 MiB pages: collapsed in the
background after a load on a CPU device, or as the ``huge pages`` load stage (before pinning
for a CUDA device); /proc/self/smaps shows them collapsed where the kernel has MADV_COLLAPSE and
THP is not off."""

from __future__ import annotations

import pytest
import torch

from freetoken.huge_pages import huge_spans
from freetoken.models.load_progress import LoadStep
from freetoken.models.registry import load_model
from freetoken.offload.backend import MoeConfig
from freetoken.offload.bank_pages import collapse_banks, fill_on_small_pages
from freetoken.offload.banks import ExpertBanks
from freetoken.packed.banks import bank_tensors
from tests.unit.smaps import anon_huge_in, collapse_supported


def _huge_bytes(spans) -> int:
    return sum(anon_huge_in(address, size) for address, size in spans)


@pytest.mark.parametrize("source", ["packed", "safetensors"])
def test_banks_move_onto_huge_pages_after_a_cpu_load(packed_pair, source) -> None:
    src, dst = packed_pair("qwen3_moe-bf16")
    steps: list[LoadStep] = []
    model = load_model(dst if source == "packed" else src,
                       moe=MoeConfig(backend="offload", cache="2"), progress=steps.append)
    assert {s.stage for s in steps} == {"read"}  # no stage: the collapse runs after the load
    collapse = model.bank_collapse
    assert collapse.wait(60)
    spans = huge_spans(bank_tensors(model.moe_runtime.banks).values())
    assert collapse.total == sum(size for _address, size in spans) > 0
    if not collapse_supported():
        assert collapse.collapsed == 0
        return
    # the kernel may lack a free 2 MiB page now and then: most, not all
    assert collapse.collapsed >= collapse.total // 2
    assert _huge_bytes(spans) >= collapse.collapsed


def test_the_huge_pages_stage_reports_and_keeps_the_bytes() -> None:
    # 2 x 8 experts of 12 MiB: banks above the heap's mmap threshold (64 MiB), so fresh
    # mappings (heap memory may be backed by huge pages already)
    banks = ExpertBanks(2, 8, 2048, 1024, torch.bfloat16)
    fill_on_small_pages([banks])
    for tensor in (banks.gate_up, banks.down):
        flat = tensor.view(torch.uint8).reshape(-1)
        flat.copy_(torch.arange(flat.numel(), dtype=torch.int32).remainder(251).to(torch.uint8))
    before = [t.clone() for t in (banks.gate_up, banks.down)]
    spans = huge_spans([banks.gate_up, banks.down])
    total = sum(size for _address, size in spans)
    # no check that the fill left small pages: memory the allocator reuses may already be huge
    steps: list[LoadStep] = []
    collapsed = collapse_banks([banks], steps.append)
    assert steps[0] == LoadStep(0, total, 1, 1, False, "huge pages")
    assert steps[-1] == LoadStep(total, total, 1, 1, True, "huge pages")
    assert [s.done_bytes for s in steps] == sorted(s.done_bytes for s in steps)
    assert all(torch.equal(a, b) for a, b in zip(before, (banks.gate_up, banks.down)))
    if collapse_supported():
        assert collapsed >= total // 2 and _huge_bytes(spans) >= collapsed
    else:
        assert collapsed == 0
