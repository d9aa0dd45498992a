"""gpt-oss's additions to the C++ decode attention (``freetoken.ops.attention_decode``): per-head
sinks, a sliding window and the o_proj bias, against the fp32 reference on every ISA variant
this CPU supports, plus the identities that pin them to the plain path and clear errors."""

from __future__ import annotations

import pytest
import torch

from freetoken.ops.attention_decode import (ATTENTION_TOLERANCE, BF16_TOLERANCE,
                                            paged_decode_attention)
from freetoken.ops.attention_decode.reference import paged_decode_attention_reference
from freetoken.ops.cpu_moe import relative_rms_error
from freetoken.ops.cpu_moe.cpu import supported_isas
from tests.ops.test_attention_decode import _case

ISAS = supported_isas()
# (hidden, heads, kv heads, head_dim, rotary dims, gated, context lengths incl. the new token),
# window: gpt-oss's layout (q/k/v bias, no q/k norm, full rotary)
SHAPES = [
    ((1024, 16, 2, 64, 64, False, (542, 1, 130)), 128),   # small gpt_oss preset
    ((256, 4, 1, 64, 64, False, (40, 33, 32, 31)), 32),  # tiny preset around its window
    ((72, 3, 1, 40, 40, False, (700, 5, 301)), 300),     # odd sizes, windows over > 1 chunk
    ((1024, 8, 2, 128, 128, False, (1100, 2)), 1030),    # >= 4 chunks: whole-row tasks
    ((72, 6, 2, 40, 40, False, (17, 9)), 1),             # the new token alone
]


def _gpt_oss_case(shape, dtype, seed):
    tensors, config = _case(shape, dtype, seed)
    g = torch.Generator().manual_seed(seed + 1)
    nh, hidden = config["num_heads"], shape[0]
    tensors.update(q_norm=None, k_norm=None,
                   qkv_bias=torch.randn(tensors["qkv_w"].shape[0], generator=g).to(dtype).float(),
                   # sinks near the log-sum-exp of the scores (unit-variance q.k * scale over
                   # tens to hundreds of keys), so they take a real share of the mass
                   sinks=4 + 2 * torch.randn(nh, generator=g),
                   o_bias=torch.randn(hidden, generator=g).to(dtype).float())
    return tensors, config


def _clone(tensors):
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in tensors.items()}


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape, window", SHAPES,
                         ids=lambda s: f"H{s[0]}-nh{s[1]}" if isinstance(s, tuple) else f"w{s}")
def test_sinks_window_and_o_bias_match_reference(isa, dtype, shape, window):
    tensors, config = _gpt_oss_case(shape, dtype, seed=shape[0] + window)
    ref_tensors = _clone(tensors)
    out = paged_decode_attention(**tensors, **config, window=window, isa=isa)
    ref = paged_decode_attention_reference(**ref_tensors, **config, window=window)
    tolerance = ATTENTION_TOLERANCE if dtype == torch.float32 else BF16_TOLERANCE
    assert relative_rms_error(ref, out) <= tolerance
    new = tensors["kv_slots"][tensors["kv_offsets"][1:] - 1]
    assert relative_rms_error(ref_tensors["pool_k"][new].float(),
                              tensors["pool_k"][new].float()) <= tolerance
    changes = ({"sinks": None}, {"o_bias": None}, {"window": 0})
    for change in changes if dtype == torch.float32 else ():  # each addition is applied
        if change.get("window") == 0 and window >= int((tensors["kv_offsets"].diff()).max()):
            continue
        other = paged_decode_attention(**{**_clone(tensors), "window": window, **change},
                                       **config, isa=isa)
        assert relative_rms_error(ref, other) > 10 * tolerance


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_residual_form_with_o_bias_matches_reference(isa, dtype):
    """With ``input_norm`` the op returns ``h + o_proj(...) + o_bias``, as the torch layer adds
    the bias before the residual."""
    tensors, config = _gpt_oss_case(SHAPES[1][0], dtype, seed=4)
    norm = torch.rand(tensors["x"].shape[1], generator=torch.Generator().manual_seed(4)) + 0.5
    ref_tensors = _clone(tensors)
    out = paged_decode_attention(**tensors, **config, window=32, input_norm=norm,
                                 input_eps=1e-5, isa=isa)
    ref = paged_decode_attention_reference(**ref_tensors, **config, window=32, input_norm=norm,
                                           input_eps=1e-5)
    h = tensors["x"].float()
    if dtype == torch.float32:
        assert relative_rms_error(ref - h, out - h) <= ATTENTION_TOLERANCE
    else:
        assert relative_rms_error(ref, out) <= BF16_TOLERANCE


@pytest.mark.parametrize("isa", ISAS)
def test_a_window_equals_attending_to_the_last_slots_only(isa):
    """A window is the op over each sequence's last ``window`` slots, bit for bit (its chunks
    start at the first visible slot); a window as long as the context is no window."""
    tensors, config = _gpt_oss_case(SHAPES[2][0], torch.float32, seed=8)
    window, off = 300, tensors["kv_offsets"]
    windowed = paged_decode_attention(**_clone(tensors), **config, window=window, isa=isa)
    kept = [tensors["kv_slots"][max(int(off[b]), int(off[b + 1]) - window):int(off[b + 1])]
            for b in range(len(off) - 1)]
    lengths = torch.tensor([0] + [len(k) for k in kept]).cumsum(0)
    trimmed = paged_decode_attention(**{**_clone(tensors), "kv_slots": torch.cat(kept),
                                        "kv_offsets": lengths}, **config, isa=isa)
    assert torch.equal(windowed, trimmed)
    longest = int((off[1:] - off[:-1]).max())
    whole = paged_decode_attention(**_clone(tensors), **config, isa=isa)
    assert torch.equal(paged_decode_attention(**_clone(tensors), **config, window=longest,
                                              isa=isa), whole)


@pytest.mark.parametrize("isa", ISAS)
def test_a_minus_infinity_sink_is_no_sink(isa):
    """A sink of -inf takes no mass: the result equals the sink-free path bit for bit, one chunk
    or several."""
    tensors, config = _gpt_oss_case(SHAPES[2][0], torch.float32, seed=6)
    plain = paged_decode_attention(**{**_clone(tensors), "sinks": None}, **config, isa=isa)
    nh = config["num_heads"]
    masked = paged_decode_attention(**{**_clone(tensors), "sinks": torch.full((nh,), -torch.inf)},
                                    **config, isa=isa)
    assert torch.equal(plain, masked)


def test_bad_gpt_oss_arguments_are_clear_errors():
    tensors, config = _gpt_oss_case(SHAPES[4][0], torch.float32, seed=2)

    def call(**change):
        return paged_decode_attention(**{**_clone(tensors), **change}, **config)

    with pytest.raises(ValueError, match=r"^sinks \[5\] must be \[6\]"):
        call(sinks=torch.zeros(5))
    with pytest.raises(TypeError, match="^sinks must be float32, got bfloat16"):
        call(sinks=torch.zeros(6, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"^o_bias \[71\] must be \[72\]"):
        call(o_bias=torch.zeros(71))
    with pytest.raises(ValueError, match=r"^window must be >= 0 \(0: no window\), got -1"):
        call(window=-1)
