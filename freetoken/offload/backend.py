"""Choosing and building the MoE backend (``--moe-backend``, ``--moe-cache-slots``).

Backends (issue 3):

* ``resident``: every expert on the device as ordinary parameters (no runtime);
* ``offload``: host banks + device cache, every miss filled (q = m);
* ``cpu``: host banks + device cache preloaded once, every miss on the CPU (q = 0);
* ``hybrid``: the q* split with online correction (``freetoken.offload.split``);
* ``auto``: ``resident`` when the whole model fits the device budget, else ``hybrid``. On a
  CPU-only machine the "device" is host memory that already holds the banks, so ``auto`` is
  ``resident``; there experts stored in a kernel format (MXFP4, NVFP4, FP8) stay so
  (``freetoken.offload.resident``).

Cache size spec: an integer number of slots (``"96"``), a fraction of all experts (``"0.25"``,
``"1.0"``), or bytes with a unit (``"2GiB"``, ``"512MB"``). Default: 25% of the experts on a CPU
device; on CUDA, what fits in free memory after the resident weights, less a reserve.
"""

from __future__ import annotations

import torch

from freetoken.offload.moe_config import (  # noqa: F401 - re-exported: the settings' old home
    CPU_ACTIVATION_CHOICES,
    MoeConfig,
    parse_cache_spec,
)

SPLIT_OF_BACKEND = {"offload": "all-fill", "cpu": "all-cpu", "hybrid": "split"}
DEFAULT_CPU_FRACTION = 0.25
CUDA_RESERVE_FRACTION = 0.15  # of free memory, kept for KV cache and activations


def resolve_cpu_activations(requested: str, bank_format: str, dtype: torch.dtype) -> str:
    """The CPU expert kernel's activations for ``--moe-cpu-activations requested``: ``auto`` is
    ``q8`` for 4-bit banks (``mxfp4``, ``q4g``) in a bf16 model, the int8 activation blocks
    llama.cpp multiplies the same 4-bit weights with (on the small gpt_oss preset's MoE block,
    0.28 vs 0.41 ms a token, within ``Q8_TOLERANCE`` of fp32 per layer, about the rounding a bf16
    model already has); ``bf16`` for fp8 banks in a bf16 model (the activations a bf16 model
    holds anyway; ``vdpbf16ps`` over the e4m3 weights as bf16 where the CPU has AVX512_BF16 and
    AVX512_VBMI); ``fp32`` otherwise (fp32 models stay exact). Other values unchanged.
    """
    if requested != "auto":
        return requested
    if dtype != torch.bfloat16:
        return "fp32"
    return {"mxfp4": "q8", "q4g": "q8", "fp8": "bf16"}.get(bank_format, "fp32")


def check_stored_activations(stored: str | None, activations: str) -> None:
    """Refuse activations the CPU kernel does not take with experts stored as ``stored``
    (``nvfp4``: fp32 only; ``fp8``: fp32 or bf16).

    Raises:
        ValueError: such a pair.
    """
    if stored == "nvfp4" and activations != "fp32":
        raise ValueError(f"--moe-cpu-activations {activations}: the CPU kernel reads NVFP4 "
                         f"experts with fp32 activations only")
    if stored == "fp8" and activations not in ("fp32", "bf16"):
        raise ValueError(f"--moe-cpu-activations {activations}: the CPU kernel reads FP8 "
                         f"experts with fp32 or bf16 activations")


def check_resident_device(moe: MoeConfig, device: torch.device) -> None:
    """Refuse resident experts in a kernel format off the CPU: only the CPU expert kernel reads
    4-bit banks, so ``--moe-backend resident`` (or ``auto`` resolving to it) with a 4-bit
    ``--moe-expert-format`` or ``q8`` activations needs the CPU as the device.

    Raises:
        ValueError: such settings with ``device`` not the CPU.
    """
    if device.type == "cpu":
        return
    if moe.expert_format != "dense":  # q8 activations need it (MoeConfig), so this covers them
        raise ValueError(f"--moe-expert-format {moe.expert_format} needs host expert banks on "
                         f"{device}: use --moe-backend offload, cpu or hybrid")


def resolve_slots(spec: str | None, slot_bytes: int, num_ids: int,
                  default_bytes: int | None = None) -> int:
    """Slots for a cache spec, clamped to ``[1, N]``.

    Args:
        spec: see :func:`parse_cache_spec`; None uses ``default_bytes`` when given, else
            :data:`DEFAULT_CPU_FRACTION` of N.
        slot_bytes: bytes of one slot.
        num_ids: N, all experts.
        default_bytes: device budget for the cache when no spec is given.
    """
    if spec is None:
        if default_bytes is not None:
            return max(1, min(num_ids, default_bytes // slot_bytes))
        return max(1, round(DEFAULT_CPU_FRACTION * num_ids))
    kind, value = parse_cache_spec(spec)
    if kind == "slots":
        slots = int(value)
    elif kind == "fraction":
        slots = round(value * num_ids)
    else:
        slots = int(value) // slot_bytes
    return max(1, min(num_ids, slots))


def device_free_bytes(device: torch.device) -> int | None:
    """Free bytes on a CUDA device (None for other devices)."""
    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    return int(free)


def resolve_backend(backend: str, device: torch.device, model_bytes: int) -> str:
    """``auto`` -> ``resident`` or ``hybrid``; other names unchanged.

    Args:
        backend: the configured backend.
        device: the compute device.
        model_bytes: bytes of every weight (experts included) in the compute dtype.
    """
    if backend != "auto":
        return backend
    free = device_free_bytes(device)
    if free is None:
        return "resident"
    return "resident" if model_bytes <= (1 - CUDA_RESERVE_FRACTION) * free else "hybrid"
