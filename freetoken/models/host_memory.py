"""Refuses, before any weight is read, a checkpoint whose weights would not fit in host memory.

Host bytes a load needs: on a CPU device every weight (routed experts in the host banks' dtype
when offloaded, the rest in the compute dtype); on a GPU only the host expert banks of an
offloading backend (non-expert weights and resident experts live on the device). Compared with
``MemAvailable`` of ``/proc/meminfo``; a machine without it is not checked.
"""

from __future__ import annotations

import torch

from freetoken.models.config import ModelConfig
from freetoken.units import format_bytes


def routed_expert_bytes(config: ModelConfig, element_size: int) -> int:
    """Bytes of every routed expert (``3 * H * I`` each) at ``element_size`` bytes per value."""
    layers = sum(config.is_moe_layer(i) for i in range(config.num_hidden_layers))
    per_expert = 3 * config.hidden_size * config.moe_intermediate_size
    return layers * config.num_experts * per_expert * element_size


def host_bytes_needed(total: int, experts: int, banks: int | None, device: torch.device) -> int:
    """Host bytes of a load.

    Args:
        total: every weight in the compute dtype; experts: the routed experts' share of it.
        banks: host expert banks of an offloading backend, or None (experts resident).
        device: the compute device.
    """
    if device.type == "cpu":
        return total - experts + (experts if banks is None else banks)
    return 0 if banks is None else banks


def available_host_memory() -> int | None:
    """``MemAvailable`` in bytes, or None where ``/proc/meminfo`` cannot be read."""
    from freetoken.offload.watcher import _mem_available

    try:
        return _mem_available()
    except (OSError, ValueError):
        return None


def check_host_memory(needed: int, available: int | None, path: object, detail: str) -> None:
    """Raise when ``needed`` exceeds ``available`` (None: unknown, not checked).

    Raises:
        ValueError: says how much is needed (``detail``: what it consists of) and available.
    """
    if available is None or needed <= available:
        return
    raise ValueError(
        f"{path}: loading needs {format_bytes(needed)} of host memory ({detail}) but only "
        f"{format_bytes(available)} is available (MemAvailable): free memory, serve on a device "
        f"with room for the non-expert weights, or pick a smaller checkpoint")
