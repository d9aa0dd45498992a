"""Loading a checkpoint with its routed experts offloaded (``--moe-backend offload|cpu|hybrid``).

The model is built on the device with an :class:`OffloadedExperts` stand-in in every MoE block;
the loader copies each expert tensor straight into its row of the host :class:`ExpertBanks`, the
banks are pinned after filling, then the device cache is sized, preloaded with a uniform hot set
(``policies.uniform_hot_set``) and wired to every block through one :class:`OffloadRuntime`.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from freetoken.models.config import ModelConfig
from freetoken.models.decoder import DecoderLM
from freetoken.models.load_progress import report_stage
from freetoken.models.loader import Checkpoint, WeightTarget
from freetoken.offload.backend import (
    CUDA_RESERVE_FRACTION,
    SPLIT_OF_BACKEND,
    MoeConfig,
    check_stored_activations,
    device_free_bytes,
    resolve_backend,
    resolve_cpu_activations,
    resolve_slots,
)
from freetoken.offload.bank_pages import (
    BackgroundCollapse,
    collapse_banks,
    fill_on_small_pages,
)
from freetoken.offload.banks import ExpertBanks
from freetoken.offload.cache import ExpertCache, slot_bytes
from freetoken.offload.policies import uniform_hot_set
from freetoken.offload.runtime import OffloadRuntime
from freetoken.offload.scores import make_scores
from freetoken.offload.split import MissSplit
from freetoken.offload.watcher import MemoryWatcher, free_memory_probe, total_memory
from freetoken.packed.load import load_checkpoint
from freetoken.units import format_bytes

logger = logging.getLogger("freetoken.offload")
DEFAULT_RATIO = 0.5  # B_P / B_H without a profile


class OffloadedExperts(nn.Module):
    """The routed experts of one MoE layer, served by the offload runtime (no parameters).

    Args:
        banks: host banks holding this layer's experts at rows ``moe_layer * E + e``.
        moe_layer: MoE layer ordinal.

    Attributes:
        runtime: set once the runtime exists (after weights are loaded).
    """

    def __init__(self, banks: ExpertBanks, moe_layer: int) -> None:
        super().__init__()
        self.banks, self.moe_layer = banks, moe_layer
        self.runtime: OffloadRuntime | None = None

    def weight_targets(self, prefix: str) -> dict[str, WeightTarget]:
        """HF expert tensor names -> this layer's bank rows."""
        return self.banks.weight_targets(self.moe_layer, prefix)

    def forward(self, x: torch.Tensor, topk_ids: torch.Tensor,
                topk_weights: torch.Tensor) -> torch.Tensor:
        """``[T, H]``, ``[T, k]``, ``[T, k]`` -> ``[T, H]`` via :meth:`OffloadRuntime.forward`."""
        return self.runtime.forward(self.moe_layer, x, topk_ids, topk_weights)


def model_bytes(model_cls: type[DecoderLM], config: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of every parameter (experts included) in ``dtype``, from a meta-device build."""
    meta = model_cls(config, dtype=dtype, device="meta")
    return sum(p.numel() * p.element_size() for p in meta.parameters())


def bank_dtype(checkpoint: Checkpoint, dtype: torch.dtype, first_expert: str) -> torch.dtype:
    """bf16 banks when computing in bf16 or when the experts are stored in bf16 (lossless);
    fp32 otherwise."""
    packed = checkpoint.packed
    stored = packed.stored_dtype if packed is not None else checkpoint.dtype(first_expert)
    if dtype == torch.bfloat16 or stored == "BF16":
        return torch.bfloat16
    return torch.float32


def first_expert_tensor(config: ModelConfig) -> str:
    """HF name of expert 0's gate_proj in the first MoE layer (its stored dtype picks the banks').

    Raises:
        ValueError: the model has no MoE layer.
    """
    first = next((i for i in range(config.num_hidden_layers) if config.is_moe_layer(i)), None)
    if first is None:
        raise ValueError("the model has no MoE layers to offload")
    if config.model_type == "gpt_oss":  # see loader.Checkpoint's gpt-oss names
        return f"model.layers.{first}.mlp.experts.0.gate_up_proj"
    return f"model.layers.{first}.mlp.experts.0.gate_proj.weight"


def stored_expert_format(checkpoint: Checkpoint, config: ModelConfig) -> str | None:
    """``"mxfp4"`` (gpt-oss releases), ``"nvfp4"`` (ModelOpt) or ``"fp8"`` (the -FP8 releases'
    per-expert block-quantised experts) when the checkpoint stores its routed experts in a
    format the host banks keep as is, else None (dequantised into dense banks). A packed
    checkpoint's banks are in that format already."""
    first = first_expert_tensor(config)
    if checkpoint.packed is not None:
        fmt = checkpoint.packed.expert_format
        return None if fmt == "dense" else fmt
    stored = checkpoint.dtype(first)
    if stored == "F8_E4M3":  # per-expert FP8 whose scale blocks do not straddle gate and up
        block = config.quant_block
        whole = block is not None and config.moe_intermediate_size % block[0] == 0
        return "fp8" if whole and not checkpoint.fused(first) else None
    return {"MXFP4": "mxfp4", "NVFP4": "nvfp4"}.get(stored)


def planned_bank_dtype(path, compute_dtype: str, packed=None) -> str:
    """The bank dtype name (``"bfloat16"`` / ``"float32"``) the loader will choose for the
    checkpoint at ``path`` computed in ``compute_dtype`` (``"float32"`` / ``"bfloat16"``); used to
    key the stored B_P/B_H profile. ``packed``: ``path``'s packed manifest, when already read.

    Raises:
        FileNotFoundError, ValueError: as :class:`Checkpoint` and ``ModelConfig.from_file``.
    """
    config = ModelConfig.from_file(path)
    dtype = torch.bfloat16 if compute_dtype == "bfloat16" else torch.float32
    checkpoint = Checkpoint.for_config(path, config, packed=packed)
    return str(bank_dtype(checkpoint, dtype, first_expert_tensor(config))).removeprefix("torch.")


def memory_watcher(runtime: OffloadRuntime, floor: int, device: torch.device) -> MemoryWatcher:
    """The ``--moe-memory-floor`` watcher of ``runtime`` on ``device``.

    Raises:
        ValueError: free memory on ``device`` cannot be read.
    """
    probe = free_memory_probe(device)
    if probe is None:
        raise ValueError(f"--moe-memory-floor: cannot read free memory on {device}")
    total = total_memory(device)
    if total is not None and floor >= total:
        logger.warning("--moe-memory-floor %s is not below the %s of memory on %s: the expert "
                       "cache will stay at its minimum of 1 slot", format_bytes(floor),
                       format_bytes(total), device)
    release = torch.cuda.empty_cache if device.type == "cuda" else None
    return MemoryWatcher(runtime, floor, probe, release=release)


def build_offloaded(model_cls: type[DecoderLM], config: ModelConfig, checkpoint: Checkpoint,
                    dtype: torch.dtype, device: str | torch.device, moe: MoeConfig,
                    bandwidths: tuple[float, float] | None = None,
                    progress=None) -> DecoderLM | None:
    """Build and load ``model_cls`` with offloaded experts, or return None for ``resident``.

    Args:
        model_cls, config, checkpoint: what to build and from where.
        dtype: compute dtype; device: compute device.
        moe: backend settings (``auto`` resolved here).
        bandwidths: profiled ``(B_P, B_H)`` GB/s for the hybrid split, or None.
        progress: ``loader.load_weights``'s per-tensor callback, or None.

    Raises:
        ValueError: checkpoint mismatch (see ``loader.load_weights``) or a bad cache spec.
    """
    device = torch.device(device)
    backend = resolve_backend(moe.backend, device, model_bytes(model_cls, config, dtype))
    if backend == "resident":
        return None
    num_layers = sum(config.is_moe_layer(i) for i in range(config.num_hidden_layers))
    bdtype = bank_dtype(checkpoint, dtype, first_expert_tensor(config))
    stored = stored_expert_format(checkpoint, config)
    if stored and moe.expert_format not in ("dense", stored):
        raise ValueError(f"--moe-expert-format {moe.expert_format}: this checkpoint's experts "
                         f"are {stored.upper()} and stay so in the host banks (use {stored}, "
                         f"or dense: as stored)")
    loaded_as = stored or str(bdtype).removeprefix("torch.")
    activations = resolve_cpu_activations(moe.cpu_activations,
                                          stored or moe.expert_format, dtype)
    check_stored_activations(stored, activations)
    if activations == "bf16" and stored != "fp8" and (stored or bdtype != torch.bfloat16):
        raise ValueError(f"--moe-cpu-activations bf16 needs bf16 or fp8 host expert banks, but "
                         f"this checkpoint's experts load as {loaded_as}: "
                         f"use --moe-cpu-activations fp32")
    swiglu = (config.swiglu_limit, config.swiglu_alpha) if config.expert_bias else None
    banks = ExpertBanks(num_layers, config.num_experts, config.hidden_size,
                        config.moe_intermediate_size, bdtype, stored or "dense", swiglu,
                        config.quant_block)
    if stored:  # the codes and scales go into the banks as stored
        checkpoint = Checkpoint.for_config(checkpoint.path, config, raw_experts=True,
                                           packed=checkpoint.packed)
    stand_ins: list[OffloadedExperts] = []

    def factory(_layer: int, moe_layer: int) -> OffloadedExperts:
        stand_ins.append(OffloadedExperts(banks, moe_layer))
        return stand_ins[-1]

    model = model_cls(config, dtype=dtype, device=device, experts_factory=factory)
    fill_on_small_pages((banks,))
    load_checkpoint(checkpoint, model.weight_targets(), progress, banks=(banks,))
    if moe.expert_format != "dense" and banks.view is None:
        dense_bytes = banks.nbytes  # the stage's bytes: the dense banks it reads
        report_stage(progress, "quantise", 0, dense_bytes)
        banks.quantize(moe.expert_format)
        report_stage(progress, "quantise", dense_bytes, dense_bytes)
    if device.type == "cuda":
        if backend != "offload":  # the CPU kernel streams the banks; before pinning: pinned
            collapse_banks((banks,), progress)  # pages cannot be collapsed
        report_stage(progress, "pin", 0, banks.nbytes)
        banks.pin()
        report_stage(progress, "pin", banks.nbytes, banks.nbytes)
    slot = slot_bytes(banks.hidden, banks.intermediate, dtype)
    free = device_free_bytes(device)
    budget = int(free * (1 - CUDA_RESERVE_FRACTION)) if free is not None else None
    floor = moe.memory_floor_bytes()
    if budget is not None and floor is not None:  # the default size leaves the floor free
        budget = max(slot, min(budget, free - floor))
    if budget is not None and moe.default_cache_bytes is not None:  # the memory plan's room
        budget = max(slot, min(budget, moe.default_cache_bytes))
    slots = resolve_slots(moe.cache, slot, banks.num_ids, budget)
    cache = ExpertCache(banks, slots, device, dtype, make_scores(moe.policy, banks.num_ids, device))
    ratio = moe.ratio or (bandwidths[0] / bandwidths[1] if bandwidths else DEFAULT_RATIO)
    split = MissSplit(moe.split or SPLIT_OF_BACKEND[backend], ratio, moe.eta)
    runtime = OffloadRuntime(banks, cache, split, backend, bandwidths, moe.log_every,
                             activations)
    if moe.preload:
        hot = uniform_hot_set(num_layers, config.num_experts, slots)
        cache.preload(torch.from_numpy(hot))
    if floor is not None:
        runtime.watcher = memory_watcher(runtime, floor, device)
    for stand_in in stand_ins:
        stand_in.runtime = runtime
    model.moe_runtime = runtime
    # last, so the rest of the load does not share the CPU with it: the server answers while
    # the banks move onto 2 MiB pages (done already for a CUDA device)
    model.bank_collapse = BackgroundCollapse((banks,)) if device.type != "cuda" else None
    logger.info("moe backend %s: %d of %d experts cached on %s (%.1f MiB), banks %.1f MiB %s%s, "
                "cpu activations %s",
                backend, slots, banks.num_ids, device, slots * slot / 2**20,
                banks.nbytes / 2**20,
                banks.format if banks.view is not None else str(bdtype).removeprefix("torch."),
                " pinned" if banks.pinned else "", activations)
    if floor is not None:
        logger.info("memory watcher: keeps %s free on %s (checked every %d steps; the expert "
                    "cache shrinks below the floor and regrows above it)", format_bytes(floor),
                    device, runtime.watcher.check_every)
    return model
