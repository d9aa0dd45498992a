"""The C++ Gated DeltaNet decode (``freetoken.ops.gdn_decode``) against its fp32 reference on
every ISA variant this CPU supports: outputs and both states over several steps, and errors."""

from __future__ import annotations

import pytest
import torch

from freetoken.ops.cpu_moe import relative_rms_error
from freetoken.ops.cpu_moe.cpu import kernels, supported_isas
from freetoken.ops.gdn_decode import BF16_TOLERANCE, GDN_TOLERANCE, gdn_decode
from freetoken.ops.gdn_decode.reference import gdn_decode_reference

ISAS = supported_isas()
STEPS = 3
# (sequences, hidden, Hk, Hv, dk, dv, conv kernel)
SHAPES = [
    (1, 1024, 4, 8, 128, 128, 4),   # small qwen3_next preset
    (3, 64, 2, 4, 16, 24, 4),        # GVA ratio 2, dv with no vector tail issue
    (2, 72, 1, 3, 20, 37, 3),        # odd sizes, vector tails
]


def _case(shape, dtype, seed):
    b, h, hk, hv, dk, dv, k = shape
    g = torch.Generator().manual_seed(seed)
    conv_dim = 2 * hk * dk + hv * dv
    rows = conv_dim + hv * dv + 2 * hv
    weights = dict(
        in_w=(torch.randn(rows, h, generator=g) / h**0.5).to(dtype),
        conv_w=(torch.randn(conv_dim, k, generator=g) / k**0.5).to(dtype),
        dt_bias=torch.randn(hv, generator=g), a_log=torch.randn(hv, generator=g) * 0.5,
        norm_w=torch.rand(dv, generator=g) + 0.5,
        out_w=(torch.randn(h, hv * dv, generator=g) / (hv * dv) ** 0.5).to(dtype),
    )
    xs = [torch.randn(b, h, generator=g).to(dtype) for _ in range(STEPS)]
    conv = [torch.randn(conv_dim, k - 1, generator=g).to(dtype) for _ in range(b)]
    rec = [torch.randn(hv, dk, dv, generator=g) * 0.1 for _ in range(b)]
    return xs, weights, conv, rec, dict(num_k_heads=hk, num_v_heads=hv, eps=1e-6)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"B{s[0]}-H{s[1]}-hk{s[2]}-hv{s[3]}")
def test_matches_reference_over_steps(isa, dtype, shape):
    xs, w, conv, rec, config = _case(shape, dtype, seed=sum(shape))
    ref_conv, ref_rec = [c.clone() for c in conv], [r.clone() for r in rec]
    tolerance = GDN_TOLERANCE if dtype == torch.float32 else BF16_TOLERANCE
    for x in xs:
        out = gdn_decode(x, *w.values(), conv, rec, **config, isa=isa)
        ref = gdn_decode_reference(x, *w.values(), ref_conv, ref_rec, **config)
        assert out.shape == ref.shape and out.dtype == torch.float32
        assert relative_rms_error(ref, out) <= tolerance
        for got, want in zip(conv + rec, ref_conv + ref_rec):
            assert relative_rms_error(want.float(), got.float()) <= tolerance
    if dtype == torch.float32:  # the conv state holds the last K-1 projected inputs, exactly
        torch.testing.assert_close(conv[0], ref_conv[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_input_norm_and_residual(isa, dtype):
    """With ``input_norm`` the op takes the residual stream and returns ``h + layer(norm(h))``."""
    xs, w, conv, rec, config = _case(SHAPES[1], dtype, seed=8)
    norm = torch.rand(xs[0].shape[1], generator=torch.Generator().manual_seed(8)) + 0.5
    ref_conv, ref_rec = [c.clone() for c in conv], [r.clone() for r in rec]
    out = gdn_decode(xs[0], *w.values(), conv, rec, **config, input_norm=norm, input_eps=1e-5,
                     isa=isa)
    ref = gdn_decode_reference(xs[0], *w.values(), ref_conv, ref_rec, **config, input_norm=norm,
                               input_eps=1e-5)
    h = xs[0].float()
    if dtype == torch.float32:  # the block's own contribution (the residual would hide it)
        assert relative_rms_error(ref - h, out - h) <= GDN_TOLERANCE
        for got, want in zip(rec, ref_rec):
            assert relative_rms_error(want, got) <= GDN_TOLERANCE
    else:  # bf16: the same as the torch norm, the op without it and the add, each in bf16
        x = torch.nn.functional.rms_norm(h, (h.shape[1],), norm, 1e-5).bfloat16()
        _, w2, conv2, rec2, _ = _case(SHAPES[1], dtype, seed=8)
        unfused = gdn_decode(x, *w2.values(), conv2, rec2, **config, isa=isa).bfloat16()
        assert relative_rms_error((h + unfused.float()).bfloat16().float(), out) <= 4e-3


@pytest.mark.parametrize("isa", ISAS)
def test_each_variant_runs_its_own_delta_rule(isa):
    xs, w, conv, rec, config = _case(SHAPES[2], torch.float32, seed=2)
    name = {"scalar": "delta_rule_scalar", "avx2": "delta_rule_avx2"}.get(isa, "delta_rule_avx512")
    before = {n: c for n, _, c in kernels()}
    gdn_decode(xs[0], *w.values(), conv, rec, **config, isa=isa)
    after = {n: c for n, _, c in kernels()}
    assert after[name] == before[name] + 1
    assert sum(after[n] - before[n] for n in after if n.startswith("delta_rule_")) == 1


def test_bad_arguments_are_clear_errors():
    xs, w, conv, rec, config = _case(SHAPES[1], torch.float32, seed=4)
    with pytest.raises(ValueError, match=r"^conv_states and recurrent need one tensor per "
                                         r"sequence \(3\)"):
        gdn_decode(xs[0], *w.values(), conv[:2], rec, **config)
    with pytest.raises(ValueError, match=r"^sequence 1: conv state \[160, 2\] / recurrent state "
                                         r"\[4, 16, 24\] must be \[160, 3\]"):
        gdn_decode(xs[0], *w.values(), [conv[0], conv[1][:, :2].contiguous(), conv[2]], rec,
                   **config)
    with pytest.raises(ValueError, match="^num_v_heads 4 is not a multiple of num_k_heads 3"):
        gdn_decode(xs[0], *w.values(), conv, rec, num_k_heads=3, num_v_heads=4, eps=1e-6)
    with pytest.raises(TypeError, match="^recurrent\\[b\\] must be float32, got bfloat16"):
        gdn_decode(xs[0], *w.values(), conv, [r.bfloat16() for r in rec], **config)
