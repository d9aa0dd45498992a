"""The C++ decode attention over a paged KV pool (``freetoken.ops.attention_decode``) against its
fp32 reference, on every ISA variant this CPU supports: outputs, the K/V it writes, the pool rows
it must leave alone, independence from the thread split, and clear errors."""

from __future__ import annotations

import pytest
import torch

from freetoken.ops.attention_decode import (ATTENTION_TOLERANCE, BF16_TOLERANCE,
                                            paged_decode_attention)
from freetoken.ops.attention_decode.reference import paged_decode_attention_reference
from freetoken.ops.cpu_moe import relative_rms_error
from freetoken.ops.cpu_moe.cpu import kernels, supported_isas

ISAS = supported_isas()
# (hidden, heads, kv heads, head_dim, rotary dims, gated, context lengths incl. the new token)
SHAPES = [
    (1024, 8, 2, 128, 128, False, (542,)),          # small qwen3_moe preset
    (1024, 8, 2, 128, 32, True, (1, 300, 700)),     # qwen3_next: gated, partial rotary, >1 chunk
    (72, 3, 1, 40, 10, True, (5, 257)),             # odd sizes, a head_dim with a vector tail
    (256, 4, 4, 64, 64, False, (256, 513, 2)),      # MHA, lengths at chunk boundaries
    (1024, 8, 2, 128, 32, True, (1100, 5)),         # >= 4 chunks: whole-row tasks over 2 kv heads
    (72, 6, 2, 40, 10, True, (1030, 17)),           # whole rows, 3 heads per kv head, a dim tail
]


def _case(shape, dtype, seed):
    hidden, nh, nkv, hd, rot, gated, lengths = shape
    g = torch.Generator().manual_seed(seed)
    b = len(lengths)
    rows = nh * hd * (2 if gated else 1) + 2 * nkv * hd
    slots = 2 * sum(lengths) + 3
    perm = torch.randperm(slots, generator=g)[: sum(lengths)]  # scattered, out of order
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64)
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, rot, 2).float() / rot))
    angles = torch.tensor([n - 1 for n in lengths]).float()[:, None] * inv_freq[None]
    return dict(
        x=torch.randn(b, hidden, generator=g).to(dtype),
        qkv_w=(torch.randn(rows, hidden, generator=g) / hidden**0.5).to(dtype),
        o_w=(torch.randn(hidden, nh * hd, generator=g) / (nh * hd) ** 0.5).to(dtype),
        q_norm=torch.rand(hd, generator=g) + 0.5, k_norm=torch.rand(hd, generator=g) + 0.5,
        cos=angles.cos(), sin=angles.sin(),
        pool_k=torch.randn(slots, nkv, hd, generator=g).to(dtype),
        pool_v=torch.randn(slots, nkv, hd, generator=g).to(dtype),
        kv_slots=perm, kv_offsets=offsets,
    ), dict(num_heads=nh, num_kv_heads=nkv, gated=gated, eps=1e-6, scale=hd**-0.5)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"H{s[0]}-nh{s[1]}-kv{s[2]}-hd{s[3]}")
def test_matches_reference_and_writes_only_the_new_rows(isa, dtype, shape):
    tensors, config = _case(shape, dtype, seed=len(shape[-1]) * 7 + shape[0])
    before_k, before_v = tensors["pool_k"].clone(), tensors["pool_v"].clone()
    ref_tensors = {k: v.clone() for k, v in tensors.items()}
    out = paged_decode_attention(**tensors, **config, isa=isa)
    ref = paged_decode_attention_reference(**ref_tensors, **config)
    assert out.shape == ref.shape and out.dtype == torch.float32
    tolerance = ATTENTION_TOLERANCE if dtype == torch.float32 else BF16_TOLERANCE
    assert relative_rms_error(ref, out) <= tolerance
    new = tensors["kv_slots"][tensors["kv_offsets"][1:] - 1]
    for got, want, before in ((tensors["pool_k"], ref_tensors["pool_k"], before_k),
                              (tensors["pool_v"], ref_tensors["pool_v"], before_v)):
        keep = torch.ones(got.shape[0], dtype=torch.bool)
        keep[new] = False
        assert torch.equal(got[keep], before[keep])  # every other row untouched
        assert relative_rms_error(want[new].float(), got[new].float()) <= tolerance


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_input_norm_and_residual(isa, dtype):
    """With ``input_norm`` the op takes the residual stream and returns ``h + attention(norm)``."""
    tensors, config = _case(SHAPES[1], dtype, seed=9)
    g = torch.Generator().manual_seed(9)
    norm = torch.rand(tensors["x"].shape[1], generator=g) + 0.5
    ref_tensors = {k: v.clone() for k, v in tensors.items()}
    out = paged_decode_attention(**tensors, **config, input_norm=norm, input_eps=1e-5, isa=isa)
    ref = paged_decode_attention_reference(**ref_tensors, **config, input_norm=norm,
                                           input_eps=1e-5)
    h = tensors["x"].float()
    if dtype == torch.float32:  # the block's own contribution (the residual would hide it)
        assert relative_rms_error(ref - h, out - h) <= ATTENTION_TOLERANCE
    else:  # bf16: the same as the torch norm, the op without it and the add, each in bf16
        x = torch.nn.functional.rms_norm(h, (h.shape[1],), norm, 1e-5).bfloat16()
        again, _ = _case(SHAPES[1], dtype, seed=9)
        unfused = paged_decode_attention(**{**again, "x": x}, **config, isa=isa).bfloat16()
        assert relative_rms_error((h + unfused.float()).bfloat16().float(), out) <= 4e-3
    with pytest.raises(ValueError, match=r"^input_norm \[5\] must be \[1024\]"):
        paged_decode_attention(**tensors, **config, input_norm=torch.ones(5))


@pytest.mark.parametrize("isa", ISAS)
def test_each_variant_runs_its_own_core(isa):
    tensors, config = _case(SHAPES[2], torch.float32, seed=3)
    name = {"scalar": "attend_scalar", "avx2": "attend_avx2"}.get(isa, "attend_avx512")
    calls = dict((n, c) for n, _, c in kernels())
    paged_decode_attention(**tensors, **config, isa=isa)
    after = dict((n, c) for n, _, c in kernels())
    assert after[name] == calls[name] + 1
    assert sum(v for k, v in after.items() if k.startswith("attend_")) == \
        sum(v for k, v in calls.items() if k.startswith("attend_")) + 1


def test_a_sequence_alone_equals_its_row_in_a_batch():
    """Each sequence attends only to its own slots: alone it gives its batched row (up to the
    projections' summation order, which depends on how many rows share a weight pass)."""
    tensors, config = _case(SHAPES[1], torch.float32, seed=11)
    batched = {k: v.clone() for k, v in tensors.items()}
    out = paged_decode_attention(**batched, **config)
    off = tensors["kv_offsets"]
    for b in range(len(off) - 1):
        one = {k: v.clone() for k, v in tensors.items()}
        one.update(x=one["x"][b : b + 1].contiguous(), cos=one["cos"][b : b + 1].contiguous(),
                   sin=one["sin"][b : b + 1].contiguous(),
                   kv_slots=one["kv_slots"][off[b] : off[b + 1]].contiguous(),
                   kv_offsets=torch.tensor([0, int(off[b + 1] - off[b])]))
        alone = paged_decode_attention(**one, **config)[0]
        assert relative_rms_error(out[b], alone) <= ATTENTION_TOLERANCE


def test_bad_arguments_are_clear_errors():
    tensors, config = _case(SHAPES[2], torch.float32, seed=5)

    def call(**change):
        return paged_decode_attention(**{**tensors, **change}, **config)

    with pytest.raises(TypeError, match="^qkv_w must be float32, got bfloat16"):
        call(qkv_w=tensors["qkv_w"].bfloat16())
    with pytest.raises(ValueError, match=r"^o_w \[72, 119\] must be \[72, 120\]"):
        call(o_w=torch.randn(72, 119))
    with pytest.raises(ValueError, match="^kv_offsets must be non-decreasing"):
        call(kv_offsets=torch.tensor([0, 9, 5]))
    with pytest.raises(ValueError, match="^attention_decode: sequence 0 has no slot"):
        call(kv_offsets=torch.tensor([0, 0, 5]))
    bad = tensors["kv_slots"].clone()
    bad[3] = tensors["pool_k"].shape[0]
    with pytest.raises(ValueError, match=r"^attention_decode: KV slot \d+ outside the pool's"):
        call(kv_slots=bad)
    with pytest.raises(ValueError, match="must be contiguous"):
        call(x=torch.randn(72, 2).t())


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape, norms", [(SHAPES[0], False), (SHAPES[2], False),
                                          (SHAPES[3], True)],
                         ids=["H1024-no-norm", "H72-no-norm", "H256-norms"])
def test_qkv_bias_and_no_qk_norm_match_reference(isa, dtype, shape, norms):
    """GLM-4.5's form: a q/k/v bias, and no q/k norm unless ``use_qk_norm`` (``hd`` then comes
    from ``qkv_w``'s rows)."""
    tensors, config = _case(shape, dtype, seed=shape[0] + 3)
    g = torch.Generator().manual_seed(5)
    rows = tensors["qkv_w"].shape[0]
    tensors["qkv_bias"] = torch.randn(rows, generator=g).to(dtype).float()
    if not norms:
        tensors["q_norm"] = tensors["k_norm"] = None
    ref_tensors = {k: v.clone() if v is not None else None for k, v in tensors.items()}
    out = paged_decode_attention(**tensors, **config, isa=isa)
    ref = paged_decode_attention_reference(**ref_tensors, **config)
    tolerance = ATTENTION_TOLERANCE if dtype == torch.float32 else BF16_TOLERANCE
    assert relative_rms_error(ref, out) <= tolerance
    new = tensors["kv_slots"][tensors["kv_offsets"][1:] - 1]
    assert relative_rms_error(ref_tensors["pool_k"][new].float(),
                              tensors["pool_k"][new].float()) <= tolerance
    without = paged_decode_attention(**{**ref_tensors, "qkv_bias": None}, **config, isa=isa)
    assert relative_rms_error(ref, without) > 10 * tolerance  # the bias is applied


def test_bias_and_norm_arguments_are_checked():
    tensors, config = _case(SHAPES[0], torch.float32, seed=1)
    with pytest.raises(ValueError, match="q_norm and k_norm must both be given or None"):
        paged_decode_attention(**{**tensors, "k_norm": None}, **config)
    with pytest.raises(ValueError, match=r"qkv_bias \[7\] must be \[1536\]"):
        paged_decode_attention(**tensors, **config, qkv_bias=torch.zeros(7))
