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


def _submit_raw(fmt, gate_up, down, **kwargs):
    """The binding directly (ExpertBankView would reject some of these first)."""
    return _ext.submit_banks(*_routing(), fmt, gate_up, down, **kwargs)


def _replace(view, bank, idx, tensor):
    tensors = list(getattr(view, bank))
    tensors[idx] = tensor
    return tuple(tensors)


MX = _view("mxfp4")
Q4 = _view("q4g", symmetric=False)
F8 = _view("fp8", block_size=(16, 16))
NV = _view("nvfp4")


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
         "unknown expert bank format 'int8'; expected one of: bf16, fp32, mxfp4, q4g, fp8, nvfp4"),
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
                              "mxfp4, q4g, fp8, nvfp4"),
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
        "unknown expert bank format 'q8'; expected one of: bf16, fp32, mxfp4, q4g, fp8, nvfp4"
    )


def test_view_metadata():
    assert (MX.num_experts, MX.hidden, MX.intermediate) == (N, H, I)
    # mxfp4: 3 * H * I / 2 bytes of codes + 3 * H * I / 32 scale bytes per expert.
    assert MX.expert_nbytes() == 3 * H * I // 2 + 3 * H * I // 32
    # q4g asymmetric, groups of 32: codes + fp16 scale + uint8 zero per group.
    assert Q4.expert_nbytes() == 3 * H * I // 2 + 3 * H * I // 32 * 3
    assert _view("fp32").expert_nbytes() == 3 * H * I * 4
    assert len(Q4.gate_up) == 3 and len(_view("q4g").gate_up) == 2


FP8_BLOCK = dict(block_size=(16, 16))


@pytest.mark.parametrize(
    "fmt,gate_up,down,kwargs,exc_type,message",
    [
        ("fp8", _replace(F8, "gate_up", 0, F8.gate_up[0].view(torch.uint8)), F8.down, FP8_BLOCK,
         TypeError, "gate_up_values must be float8_e4m3fn, got uint8"),
        ("fp8", F8.gate_up, (F8.down[0], F8.down[1].bfloat16()), FP8_BLOCK, TypeError,
         "down_scales must be float32, got bfloat16"),
        ("fp8", F8.gate_up, (F8.down[0], F8.down[1][:, :1].contiguous()), FP8_BLOCK, ValueError,
         "down_scales [4, 1, 2] does not match down_values [4, 64, 32] with block_size (16, 16): "
         "expected [N, ceil(R/bm), ceil(C/bn)] = [4, 4, 2]"),
        ("fp8", F8.gate_up, F8.down, {}, ValueError,
         "fp8 expert banks need block_size (bm, bn): the rows and columns of one scale block "
         "(the checkpoint's weight_block_size)"),
        ("fp8", F8.gate_up, F8.down, dict(block_size=(0, 16)), ValueError,
         "block_size must be two positive integers (bm, bn), got (0, 16)"),
        ("fp8", F8.gate_up, (F8.down[0],), FP8_BLOCK, ValueError,
         "fp8 down takes (values, scales), got 1 tensors"),
        ("fp8", (F8.gate_up[0][0], F8.gate_up[1]), F8.down, FP8_BLOCK, ValueError,
         "gate_up_values must be 3-D [N, 2I, H], got shape [64, 64]"),
        ("mxfp4", MX.gate_up, MX.down, dict(block_size=(128, 128)), ValueError,
         "block_size (128, 128) applies to fp8 banks only, got format mxfp4"),
        ("nvfp4", (NV.gate_up[0], NV.gate_up[1].view(torch.uint8), NV.gate_up[2]), NV.down, {},
         TypeError, "gate_up_scales must be float8_e4m3fn, got uint8"),
        ("nvfp4", NV.gate_up, (NV.down[0], NV.down[1], NV.down[2][:, :1].contiguous()), {},
         ValueError, "down_global [4, 1] does not match down_packed [4, 64, 16]: expected "
                     "[N, R] = [4, 64]"),
        ("nvfp4", NV.gate_up, (NV.down[0], NV.down[1], NV.down[2][..., None]), {}, ValueError,
         "down_global must be 2-D [N, R], got shape [4, 64, 1]"),
        ("nvfp4", NV.gate_up, (NV.down[0], NV.down[1], NV.down[2].double()), {}, TypeError,
         "down_global must be float32, got float64"),
        ("nvfp4", NV.gate_up, (NV.down[0], NV.down[1][..., :1].contiguous(), NV.down[2]), {},
         ValueError, "down_scales [4, 64, 1] does not match down_packed [4, 64, 16]: expected "
                     "[N, R, C/16] = [4, 64, 2]"),
        ("nvfp4", NV.gate_up, (NV.down[0][..., :12].contiguous(), NV.down[1], NV.down[2]), {},
         ValueError, "down_packed [4, 64, 12] holds C = 24 columns, which is not a multiple of "
                     "16 (the NVFP4 scale group)"),
        ("nvfp4", NV.gate_up[:2], NV.down, {}, ValueError,
         "nvfp4 gate_up takes (packed, scales, global), got 2 tensors"),
        ("nvfp4", NV.gate_up, NV.down, dict(activations="q8"), ValueError,
         "activations='q8' is not supported with nvfp4 expert banks (they take "
         "activations='fp32')"),
        ("fp8", F8.gate_up, F8.down, FP8_BLOCK | dict(activations="q8"), ValueError,
         "activations='q8' is not supported with fp8 expert banks (they take "
         "activations='fp32' or 'bf16')"),
    ],
    ids=lambda v: v if isinstance(v, str) and " " in v else None,
)
def test_fp8_nvfp4_bank_errors(fmt, gate_up, down, kwargs, exc_type, message):
    with pytest.raises(exc_type) as exc:
        _submit_raw(fmt, gate_up, down, **kwargs)
    assert str(exc.value) == message


def test_fp8_nvfp4_view_errors_and_metadata():
    cases = [
        (dict(block_size=None), "fp8 banks need block_size (bm, bn), the checkpoint's "
                                "weight_block_size"),
        (dict(block_size=(128,)), "fp8: block_size must be two positive integers (bm, bn), "
                                  "got (128,)"),
        (dict(block_size=(16, True)), "fp8: block_size must be two positive integers (bm, bn), "
                                      "got (16, True)"),
        (dict(down=F8.down[:1]), "fp8 down must be a tuple of 2 tensors"),
    ]
    for change, message in cases:
        with pytest.raises(ValueError) as exc:
            dataclasses.replace(F8, **change)
        assert str(exc.value) == message
    for change, message in [
        (dict(block_size=(16, 16)), "block_size applies to fp8 banks only, got format nvfp4"),
        (dict(down=NV.down[:2]), "nvfp4 down must be a tuple of 3 tensors"),
        (dict(hidden=32), "nvfp4 gate_up has logical shape [4, 64, 64], expected [4, 64, 32] "
                          "for N=4, H=32, I=32"),
    ]:
        with pytest.raises(ValueError) as exc:
            dataclasses.replace(NV, **change)
        assert str(exc.value) == message
    assert dataclasses.replace(F8, block_size=[16, 16]).block_size == (16, 16)
    # fp8: 3 * H * I value bytes + one fp32 scale per 16 x 16 block.
    assert F8.expert_nbytes() == 3 * H * I + 3 * H * I // 256 * 4
    # nvfp4: codes + one e4m3 byte per 16 columns + one fp32 global per row (2I + H rows).
    assert NV.expert_nbytes() == 3 * H * I // 2 + 3 * H * I // 16 + (2 * I + H) * 4
    with pytest.raises(ValueError) as exc:
        build_banks(torch.zeros(N, 2 * I, 40), torch.zeros(N, 40, I), "nvfp4")
    assert str(exc.value) == (
        "nvfp4: the input dimension (last, size 40) must be a multiple of the group size 16")
    with pytest.raises(ValueError) as exc:
        submit_banks(*_routing(), NV, activations="bf16")
    assert str(exc.value) == ("activations='bf16' is not supported with nvfp4 expert banks "
                              "(they take activations='fp32')")
