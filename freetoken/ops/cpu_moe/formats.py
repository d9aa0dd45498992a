"""Expert bank sets in the kernel's weight formats: a frozen view, builders and the dequantiser.

Shape letters: N flat expert ids (``l * E + e``), H hidden, I expert intermediate, G q4g group,
``bm x bn`` the fp8 scale block (``block_size``).
A bank set is the pair ``gate_up`` (logical ``[N, 2I, H]``, gate rows ``[0:I]``, up rows
``[I:2I]``) and ``down`` (logical ``[N, H, I]``), each stored as a tuple of tensors:

========  ===============================================================================
format    tensors of one bank ``[N, R, C]`` (C = input dim: H for gate_up, I for down)
========  ===============================================================================
bf16      ``(values [N, R, C] bfloat16,)``
fp32      ``(values [N, R, C] float32,)``
mxfp4     ``(blocks [N, R, C/32, 16] uint8, scales [N, R, C/32] uint8)``
q4g       ``(packed [N, R, C/2] uint8, scales [N, R, C/G] float16[, zeros [N, R, C/G] uint8])``
fp8       ``(values [N, R, C] float8_e4m3fn, scales [N, ceil(R/bm), ceil(C/bn)] float32)``
nvfp4     ``(packed [N, R, C/2] uint8, scales [N, R, C/16] float8_e4m3fn, global [N, R] float32)``
========  ===============================================================================

The quantised encodings are described in :mod:`freetoken.ops.cpu_moe.quant`. fp8 banks carry
their block shape in ``ExpertBankView.block_size`` (the checkpoint's ``weight_block_size``; any
``bm, bn >= 1``, ragged last blocks allowed). A fused fp8 ``gate_up`` built from separate
checkpoint ``gate_proj`` / ``up_proj`` grids is one bank grid only when ``bm`` divides I (true
of every release: I a multiple of 128); otherwise expand its scales to ``bm = 1`` rows
(``repeat_interleave``, exact). An nvfp4 ``gate_up`` keeps ``gate_proj``'s and ``up_proj``'s
``weight_scale_2`` apart in its per-row ``global``. Note for gpt-oss
checkpoints: their ``gate_up_proj`` rows interleave gate (even) and up (odd), while these banks
keep gate rows first, so an engine feeding gpt-oss blocks must reorder rows (``[0::2]`` then
``[1::2]`` of both blocks and scales, and of ``gate_up_proj_bias``); the biases and the clamped
activation are keywords of the kernel (:mod:`freetoken.ops.cpu_moe.cpu`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from freetoken.ops.cpu_moe.quant import (
    _check_block,
    dequantize_fp8_blocks,
    dequantize_mxfp4,
    dequantize_nvfp4,
    dequantize_q4g,
    quantize_fp8_blocks,
    quantize_mxfp4,
    quantize_nvfp4,
    quantize_q4g,
)

FORMATS = ("bf16", "fp32", "mxfp4", "q4g", "fp8", "nvfp4")
_ARITY = {"bf16": (1, 1), "fp32": (1, 1), "mxfp4": (2, 2), "q4g": (2, 3), "fp8": (2, 2),
          "nvfp4": (3, 3)}
FP8_BLOCK = (128, 128)  # the releases' weight_block_size


def _logical_shape(fmt: str, tensors: tuple[torch.Tensor, ...]) -> tuple[int, int, int]:
    """Logical ``[N, R, C]`` of one bank from its stored tensors."""
    t = tensors[0]
    if fmt == "mxfp4":
        return t.shape[0], t.shape[1], t.shape[2] * 32
    if fmt in ("q4g", "nvfp4"):
        return t.shape[0], t.shape[1], t.shape[2] * 2
    return tuple(t.shape)


@dataclass(frozen=True)
class ExpertBankView:
    """One layer set of host expert banks in one weight format, as the kernel reads them.

    Attributes:
        format: ``"bf16" | "fp32" | "mxfp4" | "q4g" | "fp8" | "nvfp4"``.
        gate_up: tensors of the ``[N, 2I, H]`` bank (see the module table).
        down: tensors of the ``[N, H, I]`` bank.
        num_experts: N.
        hidden: H.
        intermediate: I.
        block_size: fp8 only (required there): ``(bm, bn)``, the rows x input columns of one
            scale block of both banks; ``None`` for every other format.

    Raises (at construction):
        ValueError: unknown format, wrong number of tensors, tensors of rank < 3, logical
            shapes that disagree with ``(N, 2I, H)`` / ``(N, H, I)``, an fp8 view without a
            valid ``block_size`` or another format with one. Dtypes, devices, contiguity and
            scale shapes are checked by the kernel at submit time.
    """

    format: str
    gate_up: tuple[torch.Tensor, ...]
    down: tuple[torch.Tensor, ...]
    num_experts: int
    hidden: int
    intermediate: int
    block_size: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"unknown expert bank format {self.format!r}; expected one of: "
                             f"{', '.join(FORMATS)}")
        if self.format == "fp8":
            if self.block_size is None:
                raise ValueError("fp8 banks need block_size (bm, bn), the checkpoint's "
                                 "weight_block_size")
            object.__setattr__(self, "block_size", _check_block(self.block_size))
        elif self.block_size is not None:
            raise ValueError(f"block_size applies to fp8 banks only, got format {self.format}")
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
        """``(gate_up [N, 2I, H], down [N, H, I])`` in fp32: the values the kernel uses (exact
        for dense, mxfp4 and q4g; fp8 / nvfp4: their published dequantisers' fp32 values, see
        :mod:`freetoken.ops.cpu_moe.quant`)."""
        return (dequantize_bank(self.format, self.gate_up, block_size=self.block_size),
                dequantize_bank(self.format, self.down, block_size=self.block_size))


def dequantize_bank(fmt: str, tensors: tuple[torch.Tensor, ...], *,
                    block_size: tuple[int, int] | None = None) -> torch.Tensor:
    """One bank's tensors in ``fmt`` -> fp32 ``[N, R, C]`` (see the module table).

    ``block_size`` is the fp8 scale block ``(bm, bn)`` (``ExpertBankView.block_size``), needed
    for fp8 and ignored otherwise.

    Raises:
        ValueError: fp8 without ``block_size``; the dequantisers' shape errors.
        TypeError: the dequantisers' dtype errors.
    """
    if fmt == "mxfp4":
        return dequantize_mxfp4(*tensors)
    if fmt == "q4g":
        return dequantize_q4g(*tensors)
    if fmt == "fp8":
        if block_size is None:
            raise ValueError("dequantize_bank: fp8 banks need block_size (bm, bn)")
        return dequantize_fp8_blocks(*tensors, block_size)
    if fmt == "nvfp4":
        return dequantize_nvfp4(*tensors)
    return tensors[0].float()


def build_banks(
    gate_up: torch.Tensor,
    down: torch.Tensor,
    fmt: str,
    *,
    group_size: int = 32,
    symmetric: bool = True,
    block_size: tuple[int, int] = FP8_BLOCK,
) -> ExpertBankView:
    """Convert float banks ``gate_up [N, 2I, H]``, ``down [N, H, I]`` to ``fmt`` (at load time).

    Dense formats cast (``bf16``: round to nearest even; ``fp32``: exact for fp32/bf16 inputs);
    4-bit formats quantise along the input dimension (H for gate_up, I for down) with
    :func:`quantize_mxfp4` / :func:`quantize_q4g` (``group_size``, ``symmetric``: q4g only) /
    :func:`quantize_nvfp4` (gate rows and up rows as two matrices, each with its own global
    scale, as a checkpoint's ``gate_proj`` and ``up_proj``); ``fp8`` quantises each expert's
    matrices in ``block_size`` blocks (:func:`quantize_fp8_blocks`; the last blocks may be
    partial). The result is contiguous and on the CPU. Real checkpoints' quantised tensors go
    into :class:`ExpertBankView` as they are; this builds banks for tests and benchmarks.

    Raises:
        ValueError: unknown ``fmt``; for 4-bit formats, H or I not a multiple of the group size
            (32 for mxfp4, 16 for nvfp4); a bad ``block_size``; mismatched bank shapes.
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
    elif fmt == "fp8":
        gu, dn = quantize_fp8_blocks(gate_up, block_size), quantize_fp8_blocks(down, block_size)
        return ExpertBankView(fmt, gu, dn, n, h, i, block_size=tuple(block_size))
    elif fmt == "nvfp4":
        halves = [quantize_nvfp4(gate_up[:, :i]), quantize_nvfp4(gate_up[:, i:])]
        gu = tuple(torch.cat(parts, dim=1).contiguous() for parts in zip(*halves))
        dn = quantize_nvfp4(down)
    else:
        gu = quantize_q4g(gate_up, group_size=group_size, symmetric=symmetric)
        dn = quantize_q4g(down, group_size=group_size, symmetric=symmetric)
        gu, dn = tuple(t for t in gu if t is not None), tuple(t for t in dn if t is not None)
    return ExpertBankView(fmt, gu, dn, n, h, i)
