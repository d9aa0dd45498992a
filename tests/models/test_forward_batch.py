"""``forward_batch``: several sequences (prefill chunks and decode tokens mixed) in one step equal
each sequence run alone through ``forward``; the MoE sees all tokens at once; bad input changes
nothing."""

from __future__ import annotations

import pytest
import torch

from freetoken.models import attention
from freetoken.models.base import CausalLM, SequenceState
from freetoken.models.gated_deltanet import GatedDeltaNet
from freetoken.models.moe import SparseMoE
from freetoken.models.paged import PagedKV, SlotTable
from freetoken.models.registry import load_model
from freetoken.offload.backend import MoeConfig
from freetoken.prefix.kv_pool import KVPagePool
from tests.models.conftest import prompt_ids

REL_TOL = 1e-5  # of the logit scale (max |logit|), fp32
STEPS = 16
PROMPT_LENGTHS = (1, 7, 13)
# step -> (sequence, extra tokens): that sequence prefills a chunk while the others decode
CHUNKS = {3: (1, 5), 8: (0, 9), 12: (2, 2)}


@pytest.fixture(scope="module")
def model(arch, tiny_checkpoint):
    path = tiny_checkpoint(arch)
    return load_model(path), prompt_ids(path, 40)


def paged_states(ft, n: int, slots_each: int = 48):
    """``n`` paged states over one pool, each with its own table of ``slots_each`` slots."""
    pool = KVPagePool(ft.kv_layout(), num_pages=n * slots_each // 4, page_size=4)
    pool.k.zero_(), pool.v.zero_()  # storage starts uninitialised (NaN bits never compare equal)
    states = []
    for _ in range(n):
        pages = pool.alloc_pages(slots_each // 4)[::-1]  # pages in descending order
        table = SlotTable([s for p in pages for s in pool.page_slots(p)])
        states.append(ft.new_paged_state(pool, table))
    return states


def step_inputs(step: int, tokens: list[int], ids: torch.Tensor) -> list[torch.Tensor]:
    """Each sequence's next token, plus a prefill chunk for the sequence CHUNKS names."""
    inputs = [torch.tensor([t]) for t in tokens]
    if step in CHUNKS:
        seq, extra = CHUNKS[step]
        inputs[seq] = torch.cat([inputs[seq], ids[20 : 20 + extra]])
    return inputs


def test_batch_equals_each_sequence_alone(model) -> None:
    ft, ids = model
    prompts = [ids[:n] for n in PROMPT_LENGTHS]
    batched_states = paged_states(ft, 3)
    batched = ft.forward_batch(prompts, batched_states)
    assert batched.shape == (3, ft.config.vocab_size) and batched.dtype == torch.float32

    alone_states = [ft.new_state() for _ in prompts]
    alone = torch.cat([ft(p, s) for p, s in zip(prompts, alone_states)])
    tokens_b, tokens_a = [], []
    for step in range(STEPS + 1):
        scale = alone.abs().max().item()
        assert (batched - alone).abs().max().item() <= REL_TOL * scale
        tokens_b.append(batched.argmax(-1).tolist())
        tokens_a.append(alone.argmax(-1).tolist())
        if step == STEPS:
            break
        batched = ft.forward_batch(step_inputs(step, tokens_b[-1], ids), batched_states)
        alone = torch.cat([ft(x, s) for x, s in
                           zip(step_inputs(step, tokens_a[-1], ids), alone_states)])
    assert tokens_b == tokens_a  # greedy-identical, each run following its own tokens
    extra = [sum(n for s, (q, n) in CHUNKS.items() if q == i) for i in range(3)]
    for i, (b, a) in enumerate(zip(batched_states, alone_states)):
        assert b.num_tokens == a.num_tokens == PROMPT_LENGTHS[i] + STEPS + extra[i]


def _decode_run(ft, ids, paged_decode: bool, steps: int = 4, stack: bool = False):
    """Three paged sequences prefilled, then ``steps`` decode steps that all follow the first
    run's tokens (teacher-forced, so the two runs see the same inputs): logits per step. With
    ``paged_decode``, ``stack`` picks the whole-step call over one call per layer."""
    states = paged_states(ft, 3)
    ft.paged_decode, ft.decode_stack = paged_decode, stack
    try:
        logits = [ft.forward_batch([ids[:n] for n in PROMPT_LENGTHS], states)]
        for step in range(steps):
            tokens = [torch.tensor([int(t) + step]) for t in ids[:3]]
            logits.append(ft.forward_batch(tokens, states))
    finally:
        ft.paged_decode = ft.decode_stack = True
    return torch.stack(logits), states


def test_paged_decode_runs_each_layer_in_one_call(model, monkeypatch) -> None:
    """A decode step over paged states runs every attention layer, Gated DeltaNet layer and MoE
    block once for the whole batch (the C++ decode ops) and equals the per-sequence torch path at
    fp32, routing observed the same."""
    ft, ids = model
    calls = []
    attend = attention.Attention.forward_paged_decode
    moe_block = SparseMoE.forward_residual

    def counted_attention(self, h, norm, caches, batch):
        calls.append(("attention", h.shape[0]))
        return attend(self, h, norm, caches, batch)

    def counted_moe(self, h, norm):
        calls.append(("moe", h.shape[0]))
        return moe_block(self, h, norm)

    gdn_step = GatedDeltaNet.forward_decode

    def counted_gdn(self, h, norm, states):
        calls.append(("gdn", h.shape[0]))
        return gdn_step(self, h, norm, states)

    monkeypatch.setattr(attention.Attention, "forward_paged_decode", counted_attention)
    monkeypatch.setattr(SparseMoE, "forward_residual", counted_moe)
    monkeypatch.setattr(GatedDeltaNet, "forward_decode", counted_gdn)
    routes = {True: [], False: []}
    for fused in (True, False):
        ft.set_routing_observer(lambda layer, ids_, f=fused: routes[f].append((layer, ids_)))
        try:
            out = _decode_run(ft, ids, paged_decode=fused)
        finally:
            ft.set_routing_observer(None)
        if fused:
            (fused_logits, fused_states), per_step = out, list(calls)
            calls.clear()
        else:
            torch_path, torch_states = out
    attn, moe = len(ft._attention_layers()), len(ft.moe_blocks())
    gdn = len(ft.layers) - attn
    expected = [("attention", 3)] * (4 * attn) + [("moe", 3)] * (4 * moe) + [("gdn", 3)] * (4 * gdn)
    assert sorted(per_step) == sorted(expected)
    assert calls == []  # the per-sequence path runs no fused call
    assert [layer for layer, _ in routes[True]] == [layer for layer, _ in routes[False]]
    for (_, a), (_, b) in zip(routes[True], routes[False]):
        assert torch.equal(a, b)
    fused = fused_logits
    assert (fused - torch_path).abs().max().item() <= REL_TOL * torch_path.abs().max().item()
    for a, b in zip(fused_states, torch_states):
        kv_a = [kv for kv in a.layers if isinstance(kv, PagedKV)]
        kv_b = [kv for kv in b.layers if isinstance(kv, PagedKV)]
        assert [kv.length for kv in kv_a] == [kv.length for kv in kv_b]
        used = a.layers[ft._attention_layers()[0]].table.valid()[: kv_a[0].length]
        torch.testing.assert_close(kv_a[0].pool.k[:, used], kv_b[0].pool.k[:, used],
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_decode_stack_equals_one_call_per_layer(arch, tiny_checkpoint, dtype, monkeypatch) -> None:
    """A decode step as one C++ call (``decode_stack``) leaves the same K/V, recurrent states
    and routing as one call per layer, bit for bit, and its logits differ only by the final
    norm's summation order; the per-layer ops do not run."""
    from freetoken.ops.decode_stack import DecodeStack
    from freetoken.ops.cpu_moe import relative_rms_error

    path = tiny_checkpoint(arch)
    ft = load_model(path, dtype=dtype)
    ids = prompt_ids(path, 40)
    runs = []
    stack_run = DecodeStack.run

    def counted(self, *args):
        runs.append(args[0].shape[0])
        return stack_run(self, *args)

    monkeypatch.setattr(DecodeStack, "run", counted)
    out = {}
    for stack in (True, False):
        routes = []
        ft.set_routing_observer(lambda layer, ids_: routes.append((layer, ids_.clone())))
        try:
            logits, states = _decode_run(ft, ids, paged_decode=True, stack=stack)
        finally:
            ft.set_routing_observer(None)
        out[stack] = logits, states, routes
        if stack:
            assert runs == [3] * 4
            runs.clear()
    assert runs == []
    (a, states_a, routes_a), (b, states_b, routes_b) = out[True], out[False]
    assert [layer for layer, _ in routes_a] == [layer for layer, _ in routes_b]
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(routes_a, routes_b))
    for sa, sb in zip(states_a, states_b):
        assert sa.num_tokens == sb.num_tokens
        for x, y in zip(ft.recurrent_tensors(sa), ft.recurrent_tensors(sb)):
            assert torch.equal(x, y)
        kv_a = [kv for kv in sa.layers if isinstance(kv, PagedKV)]
        assert [kv.length for kv in kv_a] == [kv.length for kv in sb.layers
                                              if isinstance(kv, PagedKV)]
        used = kv_a[0].table.valid()[: kv_a[0].length]
        assert torch.equal(kv_a[0].pool.k[:, used], sb.layers[ft._attention_layers()[0]]
                           .pool.k[:, used])
    assert torch.equal(a[0], b[0])  # the prefill step is the same torch code
    assert relative_rms_error(b[1:], a[1:]) <= (1e-6 if dtype == torch.float32 else 4e-3)


def test_paged_decode_in_bf16_is_within_the_documented_tolerance(arch, tiny_checkpoint) -> None:
    """The fused decode layers in bf16 against the per-sequence torch path in bf16 (both round
    to bf16 where the model keeps values; they differ in summation order and RoPE precision)."""
    from freetoken.ops.attention_decode import BF16_TOLERANCE
    from freetoken.ops.cpu_moe import relative_rms_error

    path = tiny_checkpoint(arch)
    ft = load_model(path, dtype=torch.bfloat16)
    ids = prompt_ids(path, 40)
    fused, _ = _decode_run(ft, ids, paged_decode=True)
    torch_path, _ = _decode_run(ft, ids, paged_decode=False)
    assert torch.equal(fused[0], torch_path[0])  # the prefill step is the same torch code
    assert relative_rms_error(torch_path[1:], fused[1:]) <= BF16_TOLERANCE


def test_long_input_runs_its_leading_chunks_alone(model, monkeypatch) -> None:
    ft, ids = model
    seen = []
    build = attention.AttnContext.build

    def recording(start, length, rotary, dtype, capture=()):
        seen.append((start, length))
        return build(start, length, rotary, dtype, capture)

    monkeypatch.setattr(attention.AttnContext, "build", staticmethod(recording))
    monkeypatch.setattr(ft, "prefill_chunk", 4)
    first, second = ft.new_state(), ft.new_state()
    ft(ids[:2], second)
    seen.clear()
    out = ft.forward_batch([ids[:13], ids[2:9]], [first, second])
    # 13 tokens: chunks [0,4) [4,8) [8,12) alone, then the last token joins the batch together
    # with the other sequence's last chunk [6, 9) (7 tokens at position 2: [2,6) alone first)
    assert seen == [(0, 4), (4, 4), (8, 4), (2, 4), (12, 1), (6, 3)]
    assert (first.num_tokens, second.num_tokens) == (13, 9)
    ref_a, ref_b = ft.new_state(), ft.new_state()
    ft(ids[:2], ref_b)
    ref = torch.cat([ft(ids[:13], ref_a), ft(ids[2:9], ref_b)])
    assert (out - ref).abs().max().item() <= REL_TOL * ref.abs().max().item()


def test_decode_threads_apply_when_every_input_is_one_token(model, monkeypatch) -> None:
    ft, ids = model
    before = torch.get_num_threads()
    monkeypatch.setattr(ft, "decode_threads", before + 1)
    seen = []
    run = ft._forward_batch

    def recording(inputs, states, capture=None):
        seen.append(torch.get_num_threads())
        return run(inputs, states, capture)

    monkeypatch.setattr(ft, "_forward_batch", recording)
    states = [ft.new_state(), ft.new_state()]
    ft.forward_batch([ids[:1], ids[1:2]], states)
    ft.forward_batch([ids[:1], ids[1:3]], states)
    assert seen == [before + 1, before]
    assert torch.get_num_threads() == before


def test_bad_batch_shapes(model) -> None:
    ft, ids = model
    state = ft.new_state()
    cases = [
        ((ids[:1], [state]), "forward_batch takes a list of input_ids and a list of states"),
        (([ids[:1]], []), "forward_batch got 1 inputs but 0 states"),
        (([ids[:1], ids[:2]], [state]), "forward_batch got 2 inputs but 1 states"),
        (([], []), "forward_batch needs at least one sequence"),
    ]
    for args, message in cases:
        with pytest.raises(ValueError) as err:
            ft.forward_batch(*args)
        assert str(err.value) == message
    assert state.num_tokens == 0


def test_any_bad_input_changes_no_state(model) -> None:
    ft, ids = model
    states = paged_states(ft, 2, slots_each=8)
    ft.forward_batch([ids[:3], ids[:5]], states)
    kvs = [kv for s in states for kv in s.layers if isinstance(kv, PagedKV)]
    pool_k = kvs[0].pool.k.clone()
    with pytest.raises(ValueError) as err:
        ft.forward_batch([ids[:2], torch.tensor([1, 8256])], states)
    assert str(err.value) == "token id 8256 out of range [0, 8256)"
    with pytest.raises(ValueError) as err:
        ft.forward_batch([ids[:1], ids[:1]], [states[0], states[0]])
    assert str(err.value) == "forward_batch got the same state more than once"
    with pytest.raises(RuntimeError) as err:
        ft.forward_batch([ids[:5], ids[:4]], states)
    assert str(err.value) == ("slot table has 8 token slots but attention layer 0 needs 9 "
                              "(5 cached + 4 new); extend the SlotTable before the forward")
    assert [s.num_tokens for s in states] == [3, 5]
    assert [kv.length for kv in kvs] == [3] * (len(kvs) // 2) + [5] * (len(kvs) // 2)
    assert torch.equal(kvs[0].pool.k, pool_k)


def test_offloaded_experts_see_the_whole_batch(tiny_checkpoint) -> None:
    path = tiny_checkpoint("qwen3_next")
    resident = load_model(path)
    model = load_model(path, moe=MoeConfig(backend="hybrid", cache="0.25"), bandwidths=(4.0, 2.0))
    runtime = model.moe_runtime
    ids = prompt_ids(path, 13)
    r_states = [resident.new_state() for _ in range(3)]
    o_states = [model.new_state() for _ in range(3)]
    inputs = [ids[:1], ids[:7], ids]
    for step in range(4):
        runtime.begin_step()
        got = model.forward_batch(inputs, o_states)
        runtime.end_step()
        want = resident.forward_batch(inputs, r_states)
        assert (got - want).abs().max().item() <= REL_TOL * want.abs().max().item()
        assert got.argmax(-1).tolist() == want.argmax(-1).tolist()
        inputs = [t.reshape(1) for t in want.argmax(-1)]
    stats = runtime.stats()
    # one routed-expert call per MoE layer and step, whatever the batch size
    assert [layer.steps for layer in stats.layers] == [4] * model.config.num_hidden_layers
    runtime.cache.check_invariants()


class _Bigram(CausalLM):
    """A parameterless model: logits are one-hot of (last id + number of earlier tokens) mod V."""

    class State(SequenceState):
        def __init__(self) -> None:
            self.num_tokens = 0

    vocab = 11

    def new_state(self) -> "_Bigram.State":
        return self.State()

    def forward(self, input_ids, state, all_logits=False):
        pos = torch.arange(state.num_tokens, state.num_tokens + input_ids.numel())
        state.num_tokens += input_ids.numel()
        out = torch.nn.functional.one_hot((input_ids + pos) % self.vocab, self.vocab).double()
        return out if all_logits else out[-1:]


def test_default_forward_batch_loops_forward() -> None:
    lm = _Bigram()
    states = [lm.new_state(), lm.new_state()]
    states[1].num_tokens = 4
    out = lm.forward_batch([torch.tensor([3, 9]), torch.tensor([2])], states)
    assert out.dtype == torch.float32 and out.shape == (2, 11)
    assert out.argmax(-1).tolist() == [(9 + 1) % 11, (2 + 4) % 11]
    assert out.sum().item() == 2.0
    assert [s.num_tokens for s in states] == [2, 5]
    with pytest.raises(ValueError) as err:
        lm.forward_batch([torch.tensor([1])], states)
    assert str(err.value) == "forward_batch got 1 inputs but 2 states"
    with pytest.raises(ValueError) as err:
        lm.forward_batch([], [])
    assert str(err.value) == "forward_batch needs at least one sequence"


def test_capture_snapshots_equal_the_states_of_split_forwards(tiny_checkpoint) -> None:
    """Snapshots taken inside one forward (anchors) equal the recurrent state after forwards
    split at those positions, at odd offsets, the chunk end, and across a leading chunk."""
    path = tiny_checkpoint("qwen3_next")
    ft = load_model(path)
    ids = torch.as_tensor(prompt_ids(path, 23))
    positions = (1, 5, 12, 23)
    ft.prefill_chunk = 16  # position 23 sits in the second internal chunk
    whole = ft.new_state()
    logits, snaps = ft.forward_batch_capture([ids], [whole], [positions])
    assert sorted(snaps[0]) == list(positions)
    split = ft.new_state()
    start = 0
    for pos in positions:
        ft(ids[start:pos], split)
        start = pos
        want = ft.recurrent_tensors(split)
        got = snaps[0][pos]
        assert len(got) == len(want) == len(ft.recurrent_layout().shapes)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            assert torch.allclose(g.float(), w.float(), atol=1e-5, rtol=1e-5)
            assert g.data_ptr() != w.data_ptr()  # copies, not the live state
    for g, w in zip(ft.recurrent_tensors(whole), ft.recurrent_tensors(split)):
        assert torch.allclose(g.float(), w.float(), atol=1e-5, rtol=1e-5)
    assert logits.shape == (1, ft.config.vocab_size)


def test_capture_needs_one_tuple_per_sequence(tiny_checkpoint) -> None:
    ft = load_model(tiny_checkpoint("qwen3_next"))
    with pytest.raises(ValueError, match="one capture tuple per sequence"):
        ft.forward_batch_capture([torch.tensor([1, 2])], [ft.new_state()], [])


def test_decode_stack_follows_weights_changed_in_place(tiny_checkpoint) -> None:
    """Weights written in place after the stack was built (a norm's multiplier is a copy the
    stack holds, the rest it reads where they lie) give the logits of the per-layer path."""
    path = tiny_checkpoint("qwen3_next")
    ft = load_model(path)
    ids = prompt_ids(path, 40)
    _decode_run(ft, ids, paged_decode=True, stack=True)  # builds the stack
    with torch.no_grad():
        ft.norm.weight.mul_(1.5)
        ft.layers[1].post_norm.weight.add_(0.25)
        ft.layers[2].mlp.router.mul_(-1.0)
    stacked, _ = _decode_run(ft, ids, paged_decode=True, stack=True)
    per_layer, _ = _decode_run(ft, ids, paged_decode=True, stack=False)
    scale = per_layer.abs().max().item()
    assert (stacked - per_layer).abs().max().item() <= REL_TOL * scale
