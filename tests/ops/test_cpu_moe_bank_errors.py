"""Bad expert banks get exact errors: ExpertBankView construction and the kernel's bank checks."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from freetoken.ops.cpu_moe import ExpertBankView, build_banks
from freetoken.ops.cpu_moe import _ext
from freetoken.ops.cpu_moe.cpu import submit_banks

N, H, I = 4, 64, 32  # noqa: E741


def _routing():
    return torch.randn(2, H), torch.tensor([0, 1]), torch.tensor([0, 3]), torch.tensor([0.5, 0.5])


def _view(fmt, **kwargs) -> ExpertBankView:
    g = torch.Generator().manual_seed(0)
    return build_banks(torch.randn(N, 2 * I, H, generator=g), torch.randn(N, H, I, generator=g),
                       fmt, **kwargs)


def _submit_raw(fmt, gate_up, down):
    """The binding directly (ExpertBankView would reject some of these first)."""
    return _ext.submit_banks(*_routing(), fmt, gate_up, down)


def _replace(view, bank, idx, tensor):
    tensors = list(getattr(view, bank))
    tensors[idx] = tensor
    return tuple(tensors)


MX = _view("mxfp4")
Q4 = _view("q4g", symmetric=False)


@pytest.mark.parametrize(
    "fmt,gate_up,down,exc_type,message",
    [
        ("mxfp4", _replace(MX, "gate_up", 0, MX.gate_up[0].to(torch.int8)), MX.down, TypeError,
         "gate_up_blocks must be uint8, got int8"),
        ("mxfp4", MX.gate_up, (MX.down[0][..., :8].contiguous(), MX.down[1]), ValueError,
         "down_blocks [4, 64, 1, 8] must hold 16 bytes (32 FP4 values) per block in its last "
         "dimension"),
        ("mxfp4", MX.gate_up, (MX.down[0], MX.down[1][:, :32].contiguous()), ValueError,
         "down_scales [4, 32, 1] does not match down_blocks [4, 64, 1, 16]: expected [4, 64, 1]"),
        ("mxfp4", MX.gate_up, (MX.down[0],), ValueError,
         "mxfp4 down takes (blocks, scales), got 1 tensors"),
        ("mxfp4", (MX.gate_up[0].transpose(1, 2), MX.gate_up[1]), MX.down, ValueError,
         "gate_up_blocks must be contiguous"),
        ("mxfp4", (MX.gate_up[0][:, :32].contiguous(), MX.gate_up[1][:, :32].contiguous()),
         MX.down, ValueError,
         "gate_up [4, 32, 64] does not match down [4, 64, 32]: expected gate_up [N, 2I, H] = "
         "[4, 64, 64]"),
        ("q4g", Q4.gate_up, (Q4.down[0], Q4.down[1].float(), Q4.down[2]), TypeError,
         "down_scales must be float16, got float32"),
        ("q4g", Q4.gate_up, (Q4.down[0], torch.ones(N, H, 2).half(), Q4.down[2]), ValueError,
         "down_scales [4, 64, 2] does not match down_packed [4, 64, 16]: expected [4, 64, C/G] "
         "with C = 32 and a group size G that is a multiple of 32"),
        ("q4g", Q4.gate_up, (Q4.down[0], Q4.down[1], Q4.down[2][:, :1].contiguous()), ValueError,
         "down_zeros [4, 1, 1] does not match down_scales [4, 64, 1]"),
        ("q4g", (Q4.gate_up[0].to("meta"),) + Q4.gate_up[1:], Q4.down, ValueError,
         "gate_up_packed must be a CPU tensor, got device meta"),
        ("q4g", (Q4.gate_up[0][0],) + Q4.gate_up[1:], Q4.down, ValueError,
         "gate_up_packed must be 3-D [N, R, C/2], got shape [64, 32]"),
        ("q4g", Q4.gate_up + (Q4.down[2],), Q4.down, ValueError,
         "q4g gate_up takes (packed, scales) or (packed, scales, zeros), got 4 tensors"),
        ("bf16", (torch.zeros(N, 2 * I, H),), (torch.zeros(N, H, I).bfloat16(),), TypeError,
         "gate_up must be bfloat16, got float32"),
        ("int8", MX.gate_up, MX.down, ValueError,
         "unknown expert bank format 'int8'; expected one of: bf16, fp32, mxfp4, q4g"),
        ("mxfp4", ([1],) + MX.gate_up[1:], MX.down, TypeError,
         "gate_up_blocks must be a torch.Tensor, got list"),
    ],
    ids=lambda v: v if isinstance(v, str) and " " in v else None,
)
def test_kernel_bank_errors(fmt, gate_up, down, exc_type, message):
    with pytest.raises(exc_type) as exc:
        _submit_raw(fmt, gate_up, down)
    assert str(exc.value) == message


def test_x_must_match_4bit_banks():
    x, tok, ids, w = _routing()
    with pytest.raises(ValueError) as exc:
        submit_banks(x[:, :32].contiguous(), tok, ids, w, MX)
    assert str(exc.value) == "x [2, 32] has hidden size 32 but the expert banks have H = 64"


def test_view_errors():
    with pytest.raises(TypeError) as exc:
        submit_banks(*_routing(), (MX.gate_up, MX.down))
    assert str(exc.value) == "banks must be an ExpertBankView, got tuple"
    cases = [
        (dict(format="int4"), "unknown expert bank format 'int4'; expected one of: bf16, fp32, "
                              "mxfp4, q4g"),
        (dict(down=MX.down[:1]), "mxfp4 down must be a tuple of 2 tensors"),
        (dict(gate_up=MX.gate_up + MX.down), "mxfp4 gate_up must be a tuple of 2 tensors"),
        (dict(intermediate=64), "mxfp4 gate_up has logical shape [4, 64, 64], expected "
                                "[4, 128, 64] for N=4, H=64, I=64"),
    ]
    for change, message in cases:
        with pytest.raises(ValueError) as exc:
            dataclasses.replace(MX, **change)
        assert str(exc.value) == message
    with pytest.raises(ValueError) as exc:
        dataclasses.replace(Q4, down=Q4.down[:1])
    assert str(exc.value) == "q4g down must be a tuple of 2 or 3 tensors"
    with pytest.raises(TypeError) as exc:
        ExpertBankView.dense(torch.zeros(N, 2 * I, H), torch.zeros(N, H, I).bfloat16())
    assert str(exc.value) == (
        "dense banks must both be bfloat16 or both float32, got torch.float32 and torch.bfloat16"
    )
    with pytest.raises(ValueError) as exc:
        build_banks(torch.zeros(N, 2 * I, H), torch.zeros(N, H, I), "q8")
    assert str(exc.value) == (
        "unknown expert bank format 'q8'; expected one of: bf16, fp32, mxfp4, q4g"
    )


def test_view_metadata():
    assert (MX.num_experts, MX.hidden, MX.intermediate) == (N, H, I)
    # mxfp4: 3 * H * I / 2 bytes of codes + 3 * H * I / 32 scale bytes per expert.
    assert MX.expert_nbytes() == 3 * H * I // 2 + 3 * H * I // 32
    # q4g asymmetric, groups of 32: codes + fp16 scale + uint8 zero per group.
    assert Q4.expert_nbytes() == 3 * H * I // 2 + 3 * H * I // 32 * 3
    assert _view("fp32").expert_nbytes() == 3 * H * I * 4
    assert len(Q4.gate_up) == 3 and len(_view("q4g").gate_up) == 2
