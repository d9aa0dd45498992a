"""Resident routed experts kept in a kernel format on a CPU device (``--moe-backend resident``,
and ``auto`` there).

When the compute device is the CPU, host memory is device memory: a checkpoint whose experts are
stored in a format the CPU expert kernel reads (gpt-oss's MXFP4, ModelOpt NVFP4, the -FP8
releases' per-expert FP8) keeps them as stored instead of dequantising the pool at load (MXFP4:
a quarter of the bf16 bytes to hold and to stream per token), and ``--moe-expert-format mxfp4 |
q4g`` quantises dense experts once. Each MoE layer's experts are one :class:`BankExperts`: the
CPU expert kernel computes them, and the fused C++ decode block and decode stack read the same
banks (``block_experts``).
"""

from __future__ import annotations

import logging
import math

import torch
from torch import nn

from freetoken.core import ResidentExperts
from freetoken.huge_pages import advise_huge_pages
from freetoken.models.config import ModelConfig
from freetoken.models.decoder import DecoderLM
from freetoken.models.load_progress import report_stage
from freetoken.models.loader import Checkpoint, WeightTarget
from freetoken.offload.backend import MoeConfig, check_stored_activations, resolve_cpu_activations
from freetoken.offload.bank_pages import BackgroundCollapse, fill_on_small_pages
from freetoken.offload.banks import ExpertBanks
from freetoken.models.moe_forward import ClampedSwiGLU, grouped_swiglu
from freetoken.ops.cpu_moe.cpu import cpu_moe_banks
from freetoken.ops.cpu_moe.dequant import dequantize_experts
from freetoken.ops.linear import KERNEL_MAX_ROWS
from freetoken.ops.moe_block import bank_kwargs
from freetoken.packed.load import load_checkpoint
from freetoken.units import format_bytes

logger = logging.getLogger("freetoken.offload")
# Routed entries per expert past which a forward with fp32 activations copies MXFP4 experts
# dense for batched matmuls. One MoE layer of the small gpt_oss preset (64 experts, top-4,
# H 1024, I 512, bf16, 2 cores, machine shared): the expert kernel 29 / 48 / 86 / 197 ms at
# 128 / 256 / 512 / 1024 tokens, the copies plus matmuls 54 / 50 / 65 / 72 ms (dense resident
# experts: 30 / 56 / 56 / 55 ms).
DENSE_PREFILL_ROWS = 16
SCRATCH_BYTES = 256 * 2**20  # the dense copies of one chunk of experts


class _Scratch:
    """Buffers for the dense copies, reused across chunks, layers and steps (fresh memory for
    each chunk would cost a page fault every 4 KiB), grown on demand."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[int, torch.dtype], torch.Tensor] = {}

    def take(self, role: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A ``shape`` view of buffer ``role`` (0: gate_up, 1: down) in ``dtype``."""
        numel = math.prod(shape)
        buffer = self._buffers.get((role, dtype))
        if buffer is None or buffer.numel() < numel:
            buffer = torch.empty(numel, dtype=dtype)
            self._buffers[(role, dtype)] = buffer
        return buffer[:numel].view(shape)


_scratch = _Scratch()


def _kernel_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype ``x`` enters the expert kernels in: its own when fp32 / bf16, else fp32."""
    return x.dtype if x.dtype in (torch.float32, torch.bfloat16) else torch.float32


class BankExperts(nn.Module):
    """The routed experts of one MoE layer held in a one-layer :class:`ExpertBanks` (rows = the
    layer's experts ``0..E-1``) and computed by the CPU expert kernel.

    Args:
        banks: the layer's banks (``num_layers == 1``), dense or in a kernel format.
        activations: the kernel's activations (``fp32``; ``q8`` with mxfp4 / q4g banks; ``bf16``
            with bf16 banks), in :meth:`forward` and the fused block alike.
    """

    def __init__(self, banks: ExpertBanks, activations: str = "fp32") -> None:
        super().__init__()
        if banks.num_layers != 1:
            raise ValueError(f"BankExperts holds one layer's banks, got {banks.num_layers}")
        self.banks, self.activations = banks, activations

    @property
    def num_experts(self) -> int:
        """E."""
        return self.banks.num_experts

    def weight_targets(self, prefix: str) -> dict[str, WeightTarget]:
        """The checkpoint's expert tensors of this layer -> bank rows (as stored)."""
        return self.banks.weight_targets(0, prefix)

    def _glu(self) -> dict:
        act = self.banks.activation()
        return act.kernel_args() if act is not None else {}

    def block_experts(self, h: torch.Tensor) -> dict | None:
        """The fused decode block's routed-expert keywords (the bank set, the activations and
        gpt-oss's biases and clamp) for ``h [T, H]`` on the CPU with T at decode size, else
        None."""
        if h.device.type != "cpu" or h.shape[0] > KERNEL_MAX_ROWS:
            return None
        return {**bank_kwargs(self.banks.kernel_view(), self.activations), **self._glu()}

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``x [T, H]`` (CPU), ``ids [T, k]`` int64 expert ids, ``weights [T, k]`` -> ``[T, H]``
        in ``x``'s dtype: the gate-weighted sum of the routed experts, fp32 inside the kernel;
        past ``DENSE_PREFILL_ROWS`` entries per expert (long prefill chunks) MXFP4 experts with
        fp32 activations are copied dense (exact) into a reused scratch, up to
        ``SCRATCH_BYTES`` at a time, and run as batched matmuls (``grouped_swiglu``: the values
        and the math of dense resident experts, bit for bit)."""
        t, k = ids.shape
        if (self.banks.format == "mxfp4" and self.activations == "fp32"
                and t * k > DENSE_PREFILL_ROWS * self.num_experts):
            return self._dense_forward(x, ids, weights)
        tokens = torch.arange(t).repeat_interleave(k)
        out = cpu_moe_banks(x.to(_kernel_dtype(x)).contiguous(), tokens, ids.flatten(),
                            weights.flatten().float(), self.banks.kernel_view(),
                            activations=self.activations, **self._glu())
        return out.to(x.dtype)

    def _dense_forward(self, x: torch.Tensor, ids: torch.Tensor,
                       weights: torch.Tensor) -> torch.Tensor:
        view, act = self.banks.kernel_view(), self.banks.activation()
        dtype = _kernel_dtype(x)
        xd, wd = x.to(dtype), weights.to(dtype)
        used = ids.flatten().unique()  # sorted: experts run in id order, as resident ones do
        dense_bytes = 3 * view.hidden * view.intermediate * dtype.itemsize
        per = max(1, SCRATCH_BYTES // dense_bytes)
        out = None
        for start in range(0, used.numel(), per):
            chunk = used[start:start + per]
            local = torch.searchsorted(chunk, ids).clamp_(max=chunk.numel() - 1)
            local = torch.where(chunk[local] == ids, local, -1)
            gate_up = _scratch.take(0, (chunk.numel(), 2 * view.intermediate, view.hidden), dtype)
            down = _scratch.take(1, (chunk.numel(), view.hidden, view.intermediate), dtype)
            dequantize_experts("mxfp4", view.gate_up, chunk, dtype, out=gate_up)
            dequantize_experts("mxfp4", view.down, chunk, dtype, out=down)
            glu = None if act is None else ClampedSwiGLU(act.gate_up_bias[chunk],
                                                        act.down_bias[chunk], act.limit,
                                                        act.alpha)
            part = grouped_swiglu(xd, local, wd, gate_up, down, glu)
            out = part if out is None else out + part
        return out.to(x.dtype)


def resident_experts(model) -> ResidentExperts | None:
    """What ``GET /v1/freetoken/memory`` reports for a model whose experts are
    :class:`BankExperts`, or None (dense parameters, or an offload runtime)."""
    experts = [block.experts for block in model.moe_blocks()
               if isinstance(block.experts, BankExperts)]
    if not experts:
        return None
    return ResidentExperts(experts[0].banks.format, sum(e.banks.nbytes for e in experts),
                           experts[0].activations)


def resident_bank_format(stored: str | None, moe: MoeConfig | None) -> str | None:
    """The format resident experts keep on a CPU device: the checkpoint's stored kernel format,
    or the one ``--moe-expert-format`` asks for; None keeps dense parameters.

    Raises:
        ValueError: ``--moe-expert-format`` names another format than the stored one.
    """
    asked = moe.expert_format if moe is not None else "dense"
    if stored and asked not in ("dense", stored):
        raise ValueError(f"--moe-expert-format {asked}: this checkpoint's experts are "
                         f"{stored.upper()} and stay so (use {stored}, or dense: as stored)")
    return stored or (None if asked == "dense" else asked)


def build_resident_banks(model_cls: type[DecoderLM], config: ModelConfig,
                         checkpoint: Checkpoint, dtype: torch.dtype, fmt: str,
                         stored: str | None, moe: MoeConfig | None,
                         progress=None) -> DecoderLM:
    """Build ``model_cls`` on the CPU with :class:`BankExperts` in ``fmt`` in every MoE layer.

    Args:
        model_cls, config, checkpoint: what to build and from where.
        dtype: compute dtype (the non-expert weights; dense banks hold it, or bf16 when the
            experts are stored so).
        fmt: the banks' format (:func:`resident_bank_format`).
        stored: the checkpoint's stored expert format (read into the banks as is), or None
            (dense experts, quantised to ``fmt`` once loaded).
        moe: the backend settings (their ``cpu_activations``), or None (``auto``).
        progress: ``loader.load_weights``'s per-tensor callback, or None.

    Raises:
        ValueError: activations the banks do not take; the loader's checkpoint errors.
    """
    from freetoken.offload.loading import bank_dtype, first_expert_tensor

    activations = resolve_cpu_activations(moe.cpu_activations if moe is not None else "auto",
                                          fmt, dtype)
    check_stored_activations(stored, activations)
    if activations == "bf16" and fmt != "fp8":
        raise ValueError(f"--moe-cpu-activations bf16 needs bf16 or fp8 expert banks, but these "
                         f"experts are {fmt}: use --moe-cpu-activations fp32")
    bdtype = bank_dtype(checkpoint, dtype, first_expert_tensor(config))
    swiglu = (config.swiglu_limit, config.swiglu_alpha) if config.expert_bias else None
    layers: list[ExpertBanks] = []

    def factory(_layer: int, _moe_layer: int) -> BankExperts:
        layers.append(ExpertBanks(1, config.num_experts, config.hidden_size,
                                  config.moe_intermediate_size, bdtype, stored or "dense",
                                  swiglu, config.quant_block))
        return BankExperts(layers[-1], activations)

    if stored:
        checkpoint = Checkpoint.for_config(checkpoint.path, config, raw_experts=True,
                                           packed=checkpoint.packed)
    model = model_cls(config, dtype=dtype, device="cpu", experts_factory=factory)
    advise_huge_pages(model.parameters())
    fill_on_small_pages(layers)
    load_checkpoint(checkpoint, model.weight_targets(), progress, banks=layers)
    if not stored:  # per-layer banks: the quantise bar moves layer by layer
        total, done = sum(b.nbytes for b in layers), 0
        report_stage(progress, "quantise", 0, total)
        for banks in layers:
            done += banks.nbytes  # dense bytes, before the conversion shrinks them
            banks.quantize(fmt)
            report_stage(progress, "quantise", done, total)
    model.bank_collapse = BackgroundCollapse(layers)  # a CPU device: serve meanwhile
    logger.info("moe backend resident: routed experts kept %s on the CPU (%s), cpu activations "
                "%s", fmt if stored else f"in {fmt}",
                format_bytes(sum(b.nbytes for b in layers)), activations)
    return model


def resident_plan(config: ModelConfig, checkpoint: Checkpoint, device: torch.device,
                  moe: MoeConfig | None) -> tuple[str, str | None] | None:
    """``(bank format, stored format or None)`` when resident experts on ``device`` are kept in
    a kernel format (:func:`build_resident_banks`), else None (dense parameters).

    Raises:
        ValueError: a 4-bit ``--moe-expert-format`` or ``q8`` off the CPU
            (``check_resident_device``), or an expert format other than the stored one.
    """
    from freetoken.offload.backend import check_resident_device
    from freetoken.offload.loading import stored_expert_format

    if device.type != "cpu":
        if moe is not None:
            check_resident_device(moe, device)
        return None
    if not any(config.is_moe_layer(i) for i in range(config.num_hidden_layers)):
        return None
    stored = stored_expert_format(checkpoint, config)
    fmt = resident_bank_format(stored, moe)
    return None if fmt is None else (fmt, stored)
