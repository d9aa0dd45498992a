"""C++ CPU expert kernel vs the fp32 torch reference (freetoken/ops/cpu_moe).

Shape letters: T tokens, H hidden, I expert intermediate, N flat expert ids, K top-k.
Every ISA variant this CPU supports is forced in turn; the bound is the kernel's own
FP32_ACCUMULATION_TOLERANCE (every variant multiplies fp32 activations).
"""

from __future__ import annotations

import pytest
import torch

from freetoken.ops.cpu_moe import (
    FP32_ACCUMULATION_TOLERANCE,
    cpu_moe_reference,
    relative_rms_error,
)
from freetoken.ops.cpu_moe.cpu import cpu_moe, num_threads, submit, supported_isas

ISAS = supported_isas()
BF16_TOL = FP32_ACCUMULATION_TOLERANCE


def _banks(n: int, h: int, i: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    gate_up = (torch.randn(n, 2 * i, h, generator=g) / h**0.5).bfloat16()  # [N, 2I, H]
    down = (torch.randn(n, h, i, generator=g) / i**0.5).bfloat16()  # [N, H, I]
    return gate_up, down


def _topk_triples(t: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Random distinct top-k routing of T tokens, flattened to (token, expert, weight) triples."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(t)])  # [T, K]
    w = torch.rand(t, k, generator=g).softmax(-1)  # [T, K]
    return torch.arange(t).repeat_interleave(k), ids.flatten(), w.flatten()


def _check(isa, x, tok, ids, w, gate_up, down) -> float:
    ref = cpu_moe_reference(x, tok, ids, w, gate_up, down)
    out = cpu_moe(x, tok, ids, w, gate_up, down, isa=isa)
    assert out.shape == ref.shape and out.dtype == torch.float32
    err = relative_rms_error(ref, out)
    assert err <= BF16_TOL, f"{isa}: relative RMS error {err:.3g} > {BF16_TOL}"
    return err


def test_scalar_and_best_isa_listed():
    assert ISAS[0] == "scalar"
    assert len(set(ISAS)) == len(ISAS)
    assert set(ISAS) <= {"scalar", "avx2", "avx512", "avx512_bf16"}
    assert num_threads() >= 1


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(
    "t,h,i,n,k",
    [
        pytest.param(1, 256, 512, 8, 2, id="decode-T1"),
        pytest.param(16, 256, 512, 8, 2, id="prefill-T16"),
        pytest.param(128, 256, 128, 8, 2, id="prefill-T128"),
        pytest.param(7, 200, 72, 6, 3, id="odd-H200-I72"),
        pytest.param(3, 33, 5, 4, 4, id="tiny-H33-I5-all-experts"),
    ],
)
def test_matches_reference(isa, t, h, i, n, k):
    gate_up, down = _banks(n, h, i)
    for it in range(3):  # fresh routing each iteration
        x = torch.randn(t, h, generator=torch.Generator().manual_seed(100 + it))
        _check(isa, x, *_topk_triples(t, n, k, seed=it), gate_up, down)


@pytest.mark.parametrize("isa", ISAS)
def test_bf16_hidden_states(isa):
    gate_up, down = _banks(8, 200, 72)
    x = torch.randn(16, 200).bfloat16()
    _check(isa, x, *_topk_triples(16, 8, 2, seed=5), gate_up, down)


@pytest.mark.parametrize("isa", ISAS)
def test_hostile_routings(isa):
    t, h, i, n = 32, 200, 72, 8
    gate_up, down = _banks(n, h, i)
    x = torch.randn(t, h)
    tok = torch.arange(t)
    # Every token to one expert (the other 7 idle).
    _check(isa, x, tok, torch.full((t,), 5), torch.rand(t), gate_up, down)
    # Duplicate (token, expert) pairs: the same expert counted twice with different weights.
    tok2 = torch.tensor([0, 0, 1, 1, 1, 31])
    ids2 = torch.tensor([3, 3, 2, 2, 7, 3])
    _check(isa, x, tok2, ids2, torch.tensor([0.5, 0.25, 1.0, -1.0, 0.3, 2.0]), gate_up, down)
    # Skipped triples (-1) and tokens named by no triple give exact zeros.
    out = cpu_moe(x, tok2, torch.tensor([-1, 3, -1, -1, -1, -1]), torch.ones(6), gate_up, down,
                  isa=isa)
    ref = cpu_moe_reference(x, tok2, torch.tensor([-1, 3, -1, -1, -1, -1]), torch.ones(6),
                            gate_up, down)
    assert torch.equal(out[1:], torch.zeros(t - 1, h))
    assert relative_rms_error(ref, out) <= BF16_TOL
    # No triples at all.
    empty = torch.zeros(0, dtype=torch.int64)
    out = cpu_moe(x, empty, empty, torch.zeros(0), gate_up, down, isa=isa)
    assert torch.equal(out, torch.zeros(t, h))


def test_variants_agree_and_threads_do_not_change_results():
    """fp32-accumulating variants agree closely; repeated runs are bit-identical."""
    gate_up, down = _banks(8, 200, 72)
    x = torch.randn(16, 200)
    tri = _topk_triples(16, 8, 2, seed=9)
    outs = {isa: cpu_moe(x, *tri, gate_up, down, isa=isa) for isa in ISAS}
    for isa in ISAS:
        assert torch.equal(outs[isa], cpu_moe(x, *tri, gate_up, down, isa=isa))
    if "avx2" in outs:
        assert relative_rms_error(outs["scalar"], outs["avx2"]) < 1e-5


def test_submit_is_asynchronous_and_ordered():
    gate_up, down = _banks(8, 256, 512)
    x = torch.randn(4, 256)
    handles = [submit(x, *_topk_triples(4, 8, 2, seed=s), gate_up, down) for s in range(4)]
    outs = [hd.wait() for hd in handles]
    assert all(hd.done() for hd in handles)
    for s, out in enumerate(outs):
        ref = cpu_moe_reference(x, *_topk_triples(4, 8, 2, seed=s), gate_up, down)
        assert relative_rms_error(ref, out) <= BF16_TOL
    assert handles[0].wait() is outs[0]  # wait() is idempotent


def test_env_var_forces_isa(monkeypatch):
    gate_up, down = _banks(4, 64, 32)
    x = torch.randn(2, 64)
    tri = _topk_triples(2, 4, 2, seed=1)
    monkeypatch.setenv("FREETOKEN_CPU_MOE_ISA", "scalar")
    assert torch.equal(cpu_moe(x, *tri, gate_up, down), cpu_moe(x, *tri, gate_up, down,
                                                                 isa="scalar"))
    monkeypatch.setenv("FREETOKEN_CPU_MOE_ISA", "sse9")
    with pytest.raises(ValueError) as exc:
        cpu_moe(x, *tri, gate_up, down)
    assert str(exc.value) == (
        "unknown CPU MoE ISA 'sse9'; expected one of: scalar, avx2, avx512, avx512_bf16"
    )


def _args():
    gate_up, down = _banks(4, 64, 32)
    return dict(
        x=torch.randn(2, 64),
        token_ids=torch.tensor([0, 1]),
        expert_ids=torch.tensor([0, 3]),
        weights=torch.tensor([0.5, 0.5]),
        gate_up=gate_up,
        down=down,
    )


@pytest.mark.parametrize(
    "change,exc_type,message",
    [
        (dict(x=[[1.0] * 64] * 2), TypeError, "x must be a torch.Tensor, got list"),
        (dict(x=torch.randn(2, 64).half()), TypeError, "x must be float32 or bfloat16, got float16"),
        (dict(gate_up=torch.zeros(4, 64, 64)), ValueError,
         "gate_up and down must have the same dtype, got float32 and bfloat16"),
        (dict(gate_up=torch.zeros(4, 64, 64).half()), TypeError,
         "gate_up must be float32 or bfloat16, got float16"),
        (dict(expert_ids=torch.tensor([0, 3], dtype=torch.int32)), TypeError,
         "expert_ids must be int64, got int32"),
        (dict(weights=torch.tensor([1, 1])), TypeError, "weights must be float32, got int64"),
        (dict(x=torch.randn(64)), ValueError, "x must be 2-D [T, H], got shape [64]"),
        (dict(down=torch.zeros(4, 64, 32, 1).bfloat16()), ValueError,
         "down must be 3-D [N, H, I], got shape [4, 64, 32, 1]"),
        (dict(x=torch.randn(64, 2).t()), ValueError, "x must be contiguous"),
        (dict(x=torch.randn(2, 63)), ValueError,
         "x [2, 63] has hidden size 63 but the expert banks have H = 64"),
        (dict(gate_up=torch.zeros(4, 32, 64).bfloat16()), ValueError,
         "gate_up [4, 32, 64] does not match down [4, 64, 32]: expected gate_up [N, 2I, H] = "
         "[4, 64, 64]"),
        (dict(weights=torch.tensor([0.5])), ValueError,
         "token_ids, expert_ids and weights must have the same length, got [2], [2], [1]"),
        (dict(expert_ids=torch.tensor([0, 4])), ValueError,
         "expert_ids[1] = 4 is outside [0, 4) and is not -1 (skip)"),
        (dict(expert_ids=torch.tensor([-2, 0])), ValueError,
         "expert_ids[0] = -2 is outside [0, 4) and is not -1 (skip)"),
        (dict(token_ids=torch.tensor([0, 2])), ValueError, "token_ids[1] = 2 is outside [0, 2)"),
        (dict(x=torch.randn(2, 64, device="meta")), ValueError,
         "x must be a CPU tensor, got device meta"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_input_errors(change, exc_type, message):
    args = _args() | change
    with pytest.raises(exc_type) as exc:
        submit(**args)
    assert str(exc.value) == message


def test_unsupported_isa_error():
    with pytest.raises(ValueError) as exc:
        submit(**_args(), isa="AVX2")
    assert str(exc.value) == (
        "unknown CPU MoE ISA 'AVX2'; expected one of: scalar, avx2, avx512, avx512_bf16"
    )
    missing = [v for v in ("avx2", "avx512_bf16") if v not in ISAS]
    for isa in missing:
        with pytest.raises(ValueError) as exc:
            submit(**_args(), isa=isa)
        assert str(exc.value) == (
            f"CPU MoE ISA '{isa}' is not supported by this CPU (supported: {', '.join(ISAS)})"
        )
