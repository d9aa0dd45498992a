"""gpt-oss decode steps on the C++ decode ops (one call per layer, and the whole-step decode
stack) past the 32-key window of the tiny preset's sliding layers, over resident MXFP4 banks and
dense bf16-layout experts: the per-sequence torch path's greedy tokens (fp32) and logits within
the ops' tolerances (fp32 and bf16)."""

from __future__ import annotations

import pytest
import torch

from freetoken.models.moe_gpt_oss import GptOssExperts
from freetoken.models.paged import SlotTable
from freetoken.models.registry import load_model
from freetoken.models.tiny import make_tiny
from freetoken.offload.resident import BankExperts
from freetoken.ops.attention_decode import BF16_TOLERANCE
from freetoken.ops.cpu_moe import relative_rms_error
from freetoken.prefix.kv_pool import KVPagePool
from tests.models.conftest import prompt_ids

PROMPT_LENGTHS = (3, 30, 45)  # before, across and past the window during the steps
STEPS = 8
MODES = {"torch": (False, False), "layers": (True, False), "stack": (True, True)}


def _greedy(ft, ids, mode: str, forced: list[list[int]] | None = None):
    """Prefill three paged sequences, then ``STEPS`` decode steps on ``mode``'s path, each
    sequence following its own argmax (or ``forced``'s tokens): ``(logits [STEPS + 1, 3, V],
    tokens [STEPS][3])``."""
    pool = KVPagePool(ft.kv_layout(), num_pages=3 * 64 // 4, page_size=4)
    pool.k.zero_(), pool.v.zero_()
    states = []
    for _ in PROMPT_LENGTHS:
        pages = pool.alloc_pages(64 // 4)[::-1]  # scattered, descending slots
        states.append(ft.new_paged_state(pool, SlotTable([s for p in pages
                                                          for s in pool.page_slots(p)])))
    ft.paged_decode, ft.decode_stack = MODES[mode]
    try:
        logits = [ft.forward_batch([ids[:n] for n in PROMPT_LENGTHS], states)]
        tokens = []
        for step in range(STEPS):
            tokens.append(forced[step] if forced else logits[-1].argmax(-1).tolist())
            logits.append(ft.forward_batch([torch.tensor([t]) for t in tokens[-1]], states))
    finally:
        ft.paged_decode = ft.decode_stack = True
    return torch.stack(logits), tokens


@pytest.fixture(scope="module")
def checkpoints(tiny_checkpoint, tmp_path_factory) -> dict:
    """The released MXFP4 layout (resident experts kept as MXFP4 banks on the CPU) and the
    bf16 one (dense expert parameters)."""
    bf16 = make_tiny("gpt_oss", "tiny", tmp_path_factory.mktemp("oss") / "bf16",
                     expert_format="bf16")
    return {"mxfp4": tiny_checkpoint("gpt_oss"), "bf16": bf16}


@pytest.mark.parametrize("layout", ["mxfp4", "bf16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fused_decode_past_the_window_equals_the_torch_path(checkpoints, layout, dtype) -> None:
    path = checkpoints[layout]
    ft = load_model(path, dtype=dtype)
    experts = ft.moe_blocks()[0].experts
    assert isinstance(experts, BankExperts if layout == "mxfp4" else GptOssExperts)
    ids = prompt_ids(path, max(PROMPT_LENGTHS))
    assert ft.config.sliding_window == 32
    want, tokens = _greedy(ft, ids, "torch")
    for mode in ("layers", "stack"):
        got, got_tokens = _greedy(ft, ids, mode, forced=None if dtype == torch.float32
                                  else tokens)
        assert torch.equal(got[0], want[0])  # the prefill is the same torch code
        if dtype == torch.float32:
            assert got_tokens == tokens
            scale = want.abs().max().item()
            assert (got - want).abs().max().item() <= 1e-5 * scale
        else:  # teacher-forced: a bf16 near-tie may pick another token
            assert relative_rms_error(want[1:], got[1:]) <= BF16_TOLERANCE
    assert ft._decode_stack[0] is not None  # the stack was built and run


def test_decode_stack_follows_biases_changed_in_place(tiny_checkpoint) -> None:
    """In a bf16 model the stack takes the o_proj and router biases as fp32 copies: written in
    place after the stack was built, they give the per-layer path's logits (rebuilt stack)."""
    path = tiny_checkpoint("gpt_oss")
    ft = load_model(path, dtype=torch.bfloat16)
    ids = prompt_ids(path, max(PROMPT_LENGTHS))
    before, tokens = _greedy(ft, ids, "stack")
    with torch.no_grad():
        ft.layers[0].mixer.o_bias.add_(0.5)
        ft.layers[3].mlp.router_bias.mul_(-4.0)
    stacked, _ = _greedy(ft, ids, "stack", forced=tokens)
    per_layer, _ = _greedy(ft, ids, "layers", forced=tokens)
    assert relative_rms_error(per_layer[1:], stacked[1:]) <= 4e-3
    assert relative_rms_error(per_layer[1:], before[1:]) > 10 * 4e-3  # the change mattered
