"""Host expert banks: the source of truth for every routed expert (FreeToken paper §3.2).

All routed experts of all MoE layers are normalised into two host tensors whose leading
dimension is the flat id ``n = l * E + e`` (``l`` = MoE layer ordinal, ``e`` = expert):

* ``gate_up`` ``[N, 2I, H]``: rows ``0:I`` gate_proj, ``I:2I`` up_proj (transformers v5 fused layout);
* ``down`` ``[N, H, I]``.

Row ``n`` of both banks is one complete expert. The checkpoint loader copies each HF tensor
``model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight`` straight into its bank row
(:meth:`ExpertBanks.weight_targets`), so no per-layer copy ever exists. After loading, the banks
are page-locked when a CUDA device is present (in place with ``cudaHostRegister``, else by one
copy; never before filling), so cache fills can be asynchronous DMA; when pinning fails they stay
pageable and everything still works.

gpt-oss (``biased``): the banks also hold each expert's fp32 ``gate_up_bias [N, 2I]`` and
``down_bias [N, H]``, the checkpoint's interleaved gate / up rows are de-interleaved as they are
copied in, and a released MXFP4 checkpoint fills ``format="mxfp4"`` banks straight from its
blocks and scales (no dense copy of the pool ever exists). A ModelOpt NVFP4 checkpoint fills
``format="nvfp4"`` banks the same way (codes, e4m3 block scales, each row's global scale), an
-FP8 release ``format="fp8"`` banks (e4m3 values and their block scales).

Optionally the filled banks are converted once to a 4-bit kernel format (:meth:`quantize`: MXFP4 or
q4g, ``--moe-expert-format``): the CPU kernel then reads 4-bit codes, and a cache fill copies the
codes of one expert and dequantises them into its slot, so device and CPU compute the same values.
"""

from __future__ import annotations

import logging

import torch

from freetoken.huge_pages import advise_huge_pages
from freetoken.models.loader import WeightTarget
from freetoken.models.moe_forward import ClampedSwiGLU
from freetoken.offload.moe_config import EXPERT_FORMATS
from freetoken.ops.cpu_moe.formats import ExpertBankView, build_banks, dequantize_bank
from freetoken.packed.aligned import aligned_empty

logger = logging.getLogger("freetoken.offload")


class ExpertBanks:
    """Host banks of ``N = num_layers * num_experts`` routed experts.

    Args:
        num_layers: L, MoE layers.
        num_experts: E, routed experts per MoE layer.
        hidden: H.
        intermediate: I (``moe_intermediate_size``).
        dtype: bank dtype (``torch.bfloat16`` or ``torch.float32``) of dense banks.
        fmt: ``"dense"``, or ``"mxfp4"`` / ``"nvfp4"`` / ``"fp8"``: allocate banks in that
            format, filled as stored (gpt-oss's MXFP4 blocks, ModelOpt's NVFP4 weights, the
            -FP8 releases' e4m3 values and block scales).
        block: fp8's scale block (rows, columns); its rows must divide I.
        swiglu: gpt-oss's ``(swiglu_limit, swiglu_alpha)``: the experts are biased and clamped
            and named as gpt-oss releases them; None for the plain SwiGLU families.

    Attributes:
        gate_up: ``[N, 2I, H]`` host tensor.
        down: ``[N, H, I]`` host tensor.
        pinned: True once page-locked.

    Raises:
        ValueError: a non-positive size or an unsupported dtype.
    """

    def __init__(self, num_layers: int, num_experts: int, hidden: int, intermediate: int,
                 dtype: torch.dtype, fmt: str = "dense",
                 swiglu: tuple[float, float] | None = None,
                 block: tuple[int, int] | None = None) -> None:
        if min(num_layers, num_experts, hidden, intermediate) < 1:
            raise ValueError(f"bank sizes must be positive: L={num_layers} E={num_experts} "
                             f"H={hidden} I={intermediate}")
        if dtype not in (torch.bfloat16, torch.float32):
            raise ValueError(f"unsupported bank dtype {dtype}; supported: bfloat16, float32")
        self.num_layers, self.num_experts = num_layers, num_experts
        self.hidden, self.intermediate = hidden, intermediate
        self.dtype = dtype
        if fmt not in ("dense", "mxfp4", "nvfp4", "fp8"):
            raise ValueError(f"banks are allocated dense, mxfp4, nvfp4 or fp8, got {fmt!r}")
        if fmt == "fp8" and (block is None or intermediate % block[0]):
            raise ValueError(f"fp8 banks need scale blocks whose rows divide I={intermediate}, "
                             f"got {block}")
        n = num_layers * num_experts
        self.pinned = False
        self.format = fmt
        self.view: ExpertBankView | None = None  # 4-bit banks (allocated so, or :meth:`quantize`)
        self.swiglu = swiglu
        self.gate_up_bias = self.down_bias = None
        if swiglu is not None:
            self.gate_up_bias = torch.zeros(n, 2 * intermediate)
            self.down_bias = torch.zeros(n, hidden)
        if fmt != "dense":
            self.gate_up = self.down = None
            self.view = _empty_view(fmt, n, hidden, intermediate, block)
            advise_huge_pages(self.view.gate_up + self.view.down)
            return
        self.gate_up = aligned_empty((n, 2 * intermediate, hidden), dtype)
        self.down = aligned_empty((n, hidden, intermediate), dtype)
        advise_huge_pages((self.gate_up, self.down))  # the CPU expert kernel streams them

    @property
    def biased(self) -> bool:
        """gpt-oss experts (biases and the clamped SwiGLU)."""
        return self.swiglu is not None

    def activation(self) -> ClampedSwiGLU | None:
        """gpt-oss's MLP over all ``N`` bank rows (for the CPU kernel), or None."""
        if self.swiglu is None:
            return None
        return ClampedSwiGLU(self.gate_up_bias, self.down_bias, *self.swiglu)

    @property
    def num_ids(self) -> int:
        """N = L * E flat expert ids."""
        return self.num_layers * self.num_experts

    @property
    def expert_bytes(self) -> int:
        """Bytes of one expert in the banks (dense: ``3 * I * H * element size``; 4-bit: codes,
        scales and zero points)."""
        if self.view is not None:
            return self.view.expert_nbytes()
        return 3 * self.intermediate * self.hidden * self.gate_up.element_size()

    def kernel_view(self) -> ExpertBankView:
        """The banks as the C++ kernel's ``ExpertBankView`` (dense or 4-bit)."""
        return self.view if self.view is not None else ExpertBankView.dense(self.gate_up, self.down)

    def quantize(self, fmt: str, group_size: int = 32) -> None:
        """Convert the filled dense banks to ``fmt`` (``mxfp4`` or ``q4g``) and free them.

        Raises:
            ValueError: unknown format, already quantised, or H / I not multiples of the group.
        """
        if fmt not in EXPERT_FORMATS or fmt == "dense":
            raise ValueError(f"expert format must be mxfp4 or q4g, got {fmt!r}")
        if self.view is not None:
            raise ValueError(f"the banks are already {self.format}")
        self.view = build_banks(self.gate_up, self.down, fmt, group_size=group_size)
        self.gate_up = self.down = None
        self.format = fmt

    def rows(self, ids: list[int], device: torch.device | str = "cpu",
             non_blocking: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Experts ``ids`` as dense ``(gate_up [n, 2I, H], down [n, H, I])`` on ``device``.

        Dense banks: the bank dtype. 4-bit banks: the codes are moved to ``device`` and dequantised
        there (fp32, exactly the values the CPU kernel uses).
        """
        index = torch.tensor(ids, dtype=torch.int64)
        if self.view is None:
            gu = self.gate_up.index_select(0, index).to(device, non_blocking=non_blocking)
            dn = self.down.index_select(0, index).to(device, non_blocking=non_blocking)
            return gu, dn
        v = self.view

        def move(bank: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
            # one row view at a time: from page-locked banks each copy is a DMA (index_select
            # would first gather into pageable memory)
            return tuple(torch.stack([t[n].to(device, non_blocking=non_blocking) for n in ids])
                         for t in bank)

        return (dequantize_bank(v.format, move(v.gate_up), block_size=v.block_size),
                dequantize_bank(v.format, move(v.down), block_size=v.block_size))

    @property
    def nbytes(self) -> int:
        """Bytes of all banks."""
        return self.num_ids * self.expert_bytes

    def flat_id(self, layer: int, expert: int) -> int:
        """``layer * E + expert``."""
        return layer * self.num_experts + expert

    def weight_targets(self, layer: int, prefix: str) -> dict[str, WeightTarget]:
        """HF names ``{prefix}{e}.{gate,up,down}_proj.weight`` of MoE layer ``layer`` -> bank rows.

        Raises:
            IndexError: ``layer`` outside ``[0, L)``.
        """
        if not 0 <= layer < self.num_layers:
            raise IndexError(f"MoE layer {layer} outside [0, {self.num_layers})")
        i = self.intermediate
        if self.biased:
            return self._oss_targets(layer, prefix)
        targets = {}
        for e in range(self.num_experts):
            n = self.flat_id(layer, e)
            if self.view is not None:  # as stored: NVFP4 codes, block scales, row globals;
                # FP8 values and block scales (gate rows' blocks first, then up's)
                fp8 = self.format == "fp8"
                cut = (i, i // self.view.block_size[0] if fp8 else i, i)
                parts = ("", "_scale_inv") if fp8 else ("", "_scale", "_scale_2")
                for part, gu, dn, c in zip(parts, self.view.gate_up, self.view.down, cut):
                    targets[f"{prefix}{e}.gate_proj.weight{part}"] = WeightTarget(gu[n, :c])
                    targets[f"{prefix}{e}.up_proj.weight{part}"] = WeightTarget(gu[n, c:])
                    targets[f"{prefix}{e}.down_proj.weight{part}"] = WeightTarget(dn[n])
                continue
            targets[f"{prefix}{e}.gate_proj.weight"] = WeightTarget(self.gate_up[n, :i])
            targets[f"{prefix}{e}.up_proj.weight"] = WeightTarget(self.gate_up[n, i:])
            targets[f"{prefix}{e}.down_proj.weight"] = WeightTarget(self.down[n])
        return targets

    def _oss_targets(self, layer: int, prefix: str) -> dict[str, WeightTarget]:
        """gpt-oss's per-expert canonical names (``loader.Checkpoint``): ``{e}.gate_up_proj``
        (dense) or its ``_blocks`` / ``_scales`` (mxfp4), ``{e}.down_proj`` likewise, and both
        ``_bias`` rows; gate_up rows (codes and scales alike) de-interleaved."""
        order = torch.cat([torch.arange(0, 2 * self.intermediate, 2),
                           torch.arange(1, 2 * self.intermediate, 2)])
        targets = {}
        for e in range(self.num_experts):
            n, p = self.flat_id(layer, e), f"{prefix}{e}."
            if self.view is None:
                targets[p + "gate_up_proj"] = WeightTarget(self.gate_up[n], order)
                targets[p + "down_proj"] = WeightTarget(self.down[n])
            else:
                for kind, gu, dn in zip(("_blocks", "_scales"), self.view.gate_up,
                                        self.view.down):
                    targets[p + "gate_up_proj" + kind] = WeightTarget(gu[n], order)
                    targets[p + "down_proj" + kind] = WeightTarget(dn[n])
            targets[p + "gate_up_proj_bias"] = WeightTarget(self.gate_up_bias[n], order)
            targets[p + "down_proj_bias"] = WeightTarget(self.down_bias[n])
        return targets

    def pin(self) -> bool:
        """Page-lock the banks (call once, after they are filled). Returns :attr:`pinned`.

        Without CUDA there is nothing to pin for and the banks stay pageable. With CUDA it first
        registers the existing memory in place (no copy); if that fails it tries one copy into
        pinned memory; if that fails too (e.g. the locked-memory limit) it logs a warning and
        keeps the pageable banks.
        """
        if self.pinned or not torch.cuda.is_available():
            return self.pinned
        if self.view is not None:  # 4-bit banks: register every code / scale tensor in place
            return self._register(self.view.gate_up + self.view.down)
        try:
            cudart = torch.cuda.cudart()
            for bank in (self.gate_up, self.down):
                code = cudart.cudaHostRegister(bank.data_ptr(), bank.nbytes, 0)
                if int(code) != 0:
                    raise RuntimeError(f"cudaHostRegister returned {code}")
            self.pinned = True
        except Exception as exc:  # noqa: BLE001 - fall back to a copy, then to pageable
            logger.info("in-place pinning failed (%s); trying a pinned copy", exc)
            try:
                self.gate_up = self.gate_up.pin_memory()
                self.down = self.down.pin_memory()
                self.pinned = True
            except Exception as exc2:  # noqa: BLE001
                logger.warning("could not pin the expert banks (%s); fills stay synchronous", exc2)
        return self.pinned

    def _register(self, tensors: tuple[torch.Tensor, ...]) -> bool:
        """``cudaHostRegister`` each tensor in place; on failure unregister what was registered,
        log a warning and stay pageable."""
        cudart = torch.cuda.cudart()
        done: list[torch.Tensor] = []
        for t in tensors:
            code = int(cudart.cudaHostRegister(t.data_ptr(), t.nbytes, 0))
            if code != 0:
                for r in done:
                    cudart.cudaHostUnregister(r.data_ptr())
                logger.warning("could not pin the 4-bit expert banks (cudaHostRegister returned "
                               "%d); fills stay synchronous", code)
                return False
            done.append(t)
        self.pinned = True
        return True


def _empty_view(fmt: str, n: int, hidden: int, intermediate: int,
                block: tuple[int, int] | None) -> ExpertBankView:
    """Uninitialised page-aligned banks of ``n`` experts as stored: ``mxfp4`` (codes, E8M0
    scales),
    ``nvfp4`` (codes, e4m3 scales, fp32 row globals) or ``fp8`` (e4m3 values, fp32 scales per
    ``block``)."""
    def bank(rows: int, cols: int) -> tuple[torch.Tensor, ...]:
        if fmt == "mxfp4":
            return (aligned_empty((n, rows, cols // 32, 16), torch.uint8),
                    aligned_empty((n, rows, cols // 32), torch.uint8))
        if fmt == "fp8":
            grid = (-(-rows // block[0]), -(-cols // block[1]))
            return (aligned_empty((n, rows, cols), torch.float8_e4m3fn),
                    aligned_empty((n, *grid), torch.float32))
        return (aligned_empty((n, rows, cols // 2), torch.uint8),
                aligned_empty((n, rows, cols // 16), torch.float8_e4m3fn),
                aligned_empty((n, rows), torch.float32))

    return ExpertBankView(fmt, bank(2 * intermediate, hidden), bank(hidden, intermediate),
                          n, hidden, intermediate,
                          block_size=tuple(block) if fmt == "fp8" else None)
