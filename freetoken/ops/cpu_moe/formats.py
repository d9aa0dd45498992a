"""Expert bank sets in the kernel's weight formats: a frozen view, builders and the dequantiser.

Shape letters: N flat expert ids (``l * E + e``), H hidden, I expert intermediate, G q4g group.
A bank set is the pair ``gate_up`` (logical ``[N, 2I, H]``, gate rows ``[0:I]``, up rows
``[I:2I]``) and ``down`` (logical ``[N, H, I]``), each stored as a tuple of tensors:

========  ===============================================================================
format    tensors of one bank ``[N, R, C]`` (C = input dim: H for gate_up, I for down)
========  ===============================================================================
bf16      ``(values [N, R, C] bfloat16,)``
fp32      ``(values [N, R, C] float32,)``
mxfp4     ``(blocks [N, R, C/32, 16] uint8, scales [N, R, C/32] uint8)``
q4g       ``(packed [N, R, C/2] uint8, scales [N, R, C/G] float16[, zeros [N, R, C/G] uint8])``
========  ===============================================================================

The 4-bit encodings are described in :mod:`freetoken.ops.cpu_moe.quant`. Note for gpt-oss
checkpoints: their ``gate_up_proj`` rows interleave gate (even) and up (odd), while these banks
keep gate rows first, so an engine feeding gpt-oss blocks must reorder rows (``[0::2]`` then
``[1::2]`` of both blocks and scales, and of ``gate_up_proj_bias``); the biases and the clamped
activation are keywords of the kernel (:mod:`freetoken.ops.cpu_moe.cpu`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from freetoken.ops.cpu_moe.quant import (
    dequantize_mxfp4,
    dequantize_q4g,
    quantize_mxfp4,
    quantize_q4g,
)

FORMATS = ("bf16", "fp32", "mxfp4", "q4g")
_ARITY = {"bf16": (1, 1), "fp32": (1, 1), "mxfp4": (2, 2), "q4g": (2, 3)}


def _logical_shape(fmt: str, tensors: tuple[torch.Tensor, ...]) -> tuple[int, int, int]:
    """Logical ``[N, R, C]`` of one bank from its stored tensors."""
    t = tensors[0]
    if fmt == "mxfp4":
        return t.shape[0], t.shape[1], t.shape[2] * 32
    if fmt == "q4g":
        return t.shape[0], t.shape[1], t.shape[2] * 2
    return tuple(t.shape)


@dataclass(frozen=True)
class ExpertBankView:
    """One layer set of host expert banks in one weight format, as the kernel reads them.

    Attributes:
        format: ``"bf16" | "fp32" | "mxfp4" | "q4g"``.
        gate_up: tensors of the ``[N, 2I, H]`` bank (see the module table).
        down: tensors of the ``[N, H, I]`` bank.
        num_experts: N.
        hidden: H.
        intermediate: I.

    Raises (at construction):
        ValueError: unknown format, wrong number of tensors, tensors of rank < 3, or logical
            shapes that disagree with ``(N, 2I, H)`` / ``(N, H, I)``. Dtypes, devices, contiguity
            and scale shapes are checked by the kernel at submit time.
    """

    format: str
    gate_up: tuple[torch.Tensor, ...]
    down: tuple[torch.Tensor, ...]
    num_experts: int
    hidden: int
    intermediate: int

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"unknown expert bank format {self.format!r}; expected one of: "
                             f"{', '.join(FORMATS)}")
        lo, hi = _ARITY[self.format]
        n, h, i = self.num_experts, self.hidden, self.intermediate
        for name, bank, want in (("gate_up", self.gate_up, (n, 2 * i, h)),
                                 ("down", self.down, (n, h, i))):
            if not isinstance(bank, tuple) or not lo <= len(bank) <= hi:
                raise ValueError(f"{self.format} {name} must be a tuple of {lo}"
                                 f"{'' if lo == hi else f' or {hi}'} tensors")
            if not isinstance(bank[0], torch.Tensor) or bank[0].dim() < 3:
                raise ValueError(f"{self.format} {name} values must be a tensor of rank >= 3")
            got = tuple(int(d) for d in _logical_shape(self.format, bank))
            if got != want:
                raise ValueError(f"{self.format} {name} has logical shape {list(got)}, expected "
                                 f"{list(want)} for N={n}, H={h}, I={i}")

    @classmethod
    def dense(cls, gate_up: torch.Tensor, down: torch.Tensor) -> ExpertBankView:
        """View of dense banks ``gate_up [N, 2I, H]``, ``down [N, H, I]`` (both bf16 or fp32).

        Raises:
            TypeError: a dtype other than bfloat16/float32, or the two dtypes differ.
        """
        names = {torch.bfloat16: "bf16", torch.float32: "fp32"}
        if gate_up.dtype not in names or down.dtype != gate_up.dtype:
            raise TypeError(f"dense banks must both be bfloat16 or both float32, got "
                            f"{gate_up.dtype} and {down.dtype}")
        n, h, i = down.shape
        return cls(names[gate_up.dtype], (gate_up,), (down,), n, h, i)

    def expert_nbytes(self) -> int:
        """Bytes of one expert's weights (both banks, codes + scales + zero points)."""
        total = 0
        for t in self.gate_up + self.down:
            total += t.numel() * t.element_size()
        return total // self.num_experts

    def dequantize(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(gate_up [N, 2I, H], down [N, H, I])`` in fp32, exactly the values the kernel uses."""
        return dequantize_bank(self.format, self.gate_up), dequantize_bank(self.format, self.down)


def dequantize_bank(fmt: str, tensors: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """One bank's tensors in ``fmt`` -> fp32 ``[N, R, C]`` (exact; see the module table)."""
    if fmt == "mxfp4":
        return dequantize_mxfp4(*tensors)
    if fmt == "q4g":
        return dequantize_q4g(*tensors)
    return tensors[0].float()


def build_banks(
    gate_up: torch.Tensor,
    down: torch.Tensor,
    fmt: str,
    *,
    group_size: int = 32,
    symmetric: bool = True,
) -> ExpertBankView:
    """Convert float banks ``gate_up [N, 2I, H]``, ``down [N, H, I]`` to ``fmt`` (at load time).

    Dense formats cast (``bf16``: round to nearest even; ``fp32``: exact for fp32/bf16 inputs);
    4-bit formats quantise along the input dimension (H for gate_up, I for down) with
    :func:`quantize_mxfp4` / :func:`quantize_q4g` (``group_size``, ``symmetric``: q4g only).
    The result is contiguous and on the CPU.

    Raises:
        ValueError: unknown ``fmt``; for 4-bit formats, H or I not a multiple of the group size
            (32 for mxfp4); mismatched bank shapes.
        TypeError: non-floating-point inputs.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown expert bank format {fmt!r}; expected one of: "
                         f"{', '.join(FORMATS)}")
    if gate_up.dim() != 3 or down.dim() != 3:
        raise ValueError(f"gate_up and down must be 3-D, got {list(gate_up.shape)} and "
                         f"{list(down.shape)}")
    n, h, i = down.shape
    if tuple(gate_up.shape) != (n, 2 * i, h):
        raise ValueError(f"gate_up {list(gate_up.shape)} does not match down {list(down.shape)}: "
                         f"expected gate_up [N, 2I, H] = {[n, 2 * i, h]}")
    if fmt in ("bf16", "fp32"):
        dt = torch.bfloat16 if fmt == "bf16" else torch.float32
        gu = (gate_up.detach().to("cpu", dt).contiguous(),)
        dn = (down.detach().to("cpu", dt).contiguous(),)
    elif fmt == "mxfp4":
        gu, dn = quantize_mxfp4(gate_up), quantize_mxfp4(down)
    else:
        gu = quantize_q4g(gate_up, group_size=group_size, symmetric=symmetric)
        dn = quantize_q4g(down, group_size=group_size, symmetric=symmetric)
        gu, dn = tuple(t for t in gu if t is not None), tuple(t for t in dn if t is not None)
    return ExpertBankView(fmt, gu, dn, n, h, i)
