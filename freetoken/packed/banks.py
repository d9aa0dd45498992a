"""Packed bank tensors <-> :class:`~freetoken.offload.banks.ExpertBanks`.

A bank's tensors are named as in the manifest: ``gate_up`` / ``down`` for dense banks, ``gate_up.k``
/ ``down.k`` for the k-th tensor of a quantised one (``ExpertBankView``'s order: codes, scales,
row globals), and ``gate_up_bias`` / ``down_bias`` for gpt-oss's biases.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from freetoken.models.loader import dequantize_blocks
from freetoken.offload.banks import ExpertBanks
from freetoken.ops.cpu_moe.quant import dequantize_mxfp4, dequantize_nvfp4
from freetoken.packed.manifest import PackedManifest
from freetoken.packed.reader import ChunkReader, chunk_reads

# Stand-in (limit, alpha) of staging banks: only whether the experts are biased matters there.
_BIASED = (0.0, 0.0)


def bank_tensors(banks: ExpertBanks) -> dict[str, torch.Tensor]:
    """Every tensor of ``banks`` by its manifest name (each ``[num_ids, ...]``, contiguous)."""
    if banks.view is None:
        out = {"gate_up": banks.gate_up, "down": banks.down}
    else:
        out = {f"gate_up.{k}": t for k, t in enumerate(banks.view.gate_up)}
        out.update({f"down.{k}": t for k, t in enumerate(banks.view.down)})
    if banks.biased:
        out.update(gate_up_bias=banks.gate_up_bias, down_bias=banks.down_bias)
    return out


def bank_dtype_name(banks: ExpertBanks) -> str | None:
    """``bfloat16`` / ``float32`` for dense banks, None for quantised ones."""
    return str(banks.dtype).removeprefix("torch.") if banks.view is None else None


def empty_banks(manifest: PackedManifest, num_layers: int) -> ExpertBanks:
    """Uninitialised banks of ``num_layers`` MoE layers in the manifest's format and dtype."""
    dtype = torch.float32 if manifest.dtype == "float32" else torch.bfloat16
    return ExpertBanks(num_layers, manifest.num_experts, manifest.hidden, manifest.intermediate,
                       dtype, manifest.expert_format, _BIASED if manifest.biased else None,
                       manifest.block)


def matches(manifest: PackedManifest, banks: ExpertBanks) -> bool:
    """Whether ``banks`` hold the packed bytes as they are (same format, dtype and sizes), so
    they can be read into directly."""
    return (banks.format == manifest.expert_format and bank_dtype_name(banks) == manifest.dtype
            and (banks.num_experts, banks.hidden, banks.intermediate)
            == (manifest.num_experts, manifest.hidden, manifest.intermediate)
            and banks.biased == manifest.biased
            and (banks.view is None or banks.view.block_size == manifest.block))


def fill_banks(manifest: PackedManifest, reader: ChunkReader, banks: ExpertBanks,
               first_layer: int, progress: Callable[[int], None] | None = None) -> None:
    """Read MoE layers ``first_layer ..`` (``banks.num_layers`` of them) into ``banks``.

    Raises:
        ValueError: the banks' tensors are not the manifest's (names or sizes), and the
            reader's errors (truncated file, checksum mismatch).
    """
    tensors = bank_tensors(banks)
    stored = {b.name: b for b in manifest.banks}
    if set(tensors) != set(stored):
        raise ValueError(f"{manifest.path}: packed banks {sorted(stored)} do not match the "
                         f"runtime's {sorted(tensors)}")
    layers = range(first_layer, first_layer + banks.num_layers)
    reads = []
    for name, tensor in tensors.items():
        reads += chunk_reads(manifest, stored[name], tensor, layers)
    reader.read(reads, progress)


def expert_source(banks: ExpertBanks, sources: dict, name: str,
                  dtype: torch.dtype) -> torch.Tensor:
    """Expert tensor ``name`` (canonical, as ``banks.weight_targets`` names them) from the filled
    one-layer ``banks``, for a target of ``dtype``: the bank rows themselves, or dequantised as
    the safetensors loader does (a dense target of quantised banks). Rows are in the banks' order
    (gpt-oss's gate / up already de-interleaved).

    Raises:
        KeyError: the banks have no such tensor.
    """
    dense_target = dtype in (torch.float32, torch.bfloat16, torch.float16)
    fmt = banks.format
    if fmt == "mxfp4" and name not in sources:
        return dequantize_mxfp4(sources[name + "_blocks"].dest, sources[name + "_scales"].dest)
    if fmt == "nvfp4" and dense_target and name + "_scale" in sources:
        global_ = sources[name + "_scale_2"].dest
        return dequantize_nvfp4(sources[name].dest, sources[name + "_scale"].dest, global_)
    if fmt == "fp8" and dense_target and name + "_scale_inv" in sources:
        return dequantize_blocks(sources[name].dest, sources[name + "_scale_inv"].dest)
    return sources[name].dest
