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

import re
from dataclasses import dataclass

import torch

from freetoken.offload.banks import EXPERT_FORMATS
from freetoken.offload.control import MOE_BACKENDS, parse_bytes
from freetoken.offload.scores import POLICIES
from freetoken.offload.split import MODES
from freetoken.ops.cpu_moe import ACTIVATIONS as CPU_ACTIVATIONS

SPLIT_OF_BACKEND = {"offload": "all-fill", "cpu": "all-cpu", "hybrid": "split"}
CPU_ACTIVATION_CHOICES = ("auto", *CPU_ACTIVATIONS)
DEFAULT_CPU_FRACTION = 0.25
CUDA_RESERVE_FRACTION = 0.15  # of free memory, kept for KV cache and activations
_INT = re.compile(r"^\s*\d+\s*$")
_FRACTION = re.compile(r"^\s*\d*\.\d*\s*$")


@dataclass(frozen=True)
class MoeConfig:
    """MoE backend settings (one frozen object, validated on construction).

    Attributes:
        backend: one of ``resident, offload, cpu, hybrid, auto``.
        cache: cache size spec (slots, fraction or bytes; see module doc) or None for the default.
        policy: eviction policy, ``lru`` or ``lfu-decay``.
        split: override of the miss split mode (``split``, ``static``, ``all-fill``,
            ``all-cpu``; benchmarks compare them); None = the backend's own.
        ratio: override of the initial ``B_P / B_H``; None = from the profile (0.5 without one).
        eta: online correction gain of the split.
        preload: fill the cache with a uniform hot set at load (every backend but resident).
        log_every: summary log line every this many steps (0 = never).
        expert_format: host bank format: ``dense`` (the bank dtype), or the 4-bit ``mxfp4`` /
            ``q4g`` (quantised once at load; every backend then computes the dequantised values).
        cpu_activations: activations of the CPU expert kernel (the misses run on the CPU, and
            4-bit resident experts of a CPU device): ``auto`` (default,
            :func:`resolve_cpu_activations`: ``q8`` for 4-bit banks in a bf16 model, else
            ``fp32``), ``fp32`` (exact up to fp32 summation order) or ``q8`` (int8 per 32-column block,
            exact integer block sums; faster, within ``freetoken.ops.cpu_moe.Q8_TOLERANCE`` of
            fp32 per MoE layer), ``q8`` needing ``expert_format`` ``mxfp4`` or ``q4g``; or ``bf16``
            (activations rounded to bf16, ``vdpbf16ps`` on CPUs with AVX512_BF16; within
            ``freetoken.ops.cpu_moe.BF16_TOLERANCE``), needing dense bf16 banks (the load
            refuses a checkpoint whose banks would be fp32).
        memory_floor: free device memory to keep, as a size with a unit (``"2GiB"``), or None
            (no watcher). With a floor, a memory watcher
            (``freetoken.offload.watcher``) shrinks the expert cache when free memory drops below
            it and regrows it toward the requested size when memory returns.
        default_cache_bytes: caps the default cache size on a CUDA device (``freetoken serve``:
            the memory plan's room for the expert cache, what the KV pool and the reserve leave);
            None: no cap. An explicit ``cache`` is taken as given.

    Raises:
        ValueError: unknown backend / policy / split, bad cache spec, bad ratio or eta, unknown
            ``cpu_activations``, ``q8`` with dense banks or ``bf16`` with 4-bit ones, or
            with ``resident`` (``bf16``), a bad ``memory_floor`` or one with ``resident``.
            ``resident`` with a 4-bit ``expert_format`` or ``q8`` is valid on a CPU device only
            (:func:`check_resident_device`).
    """

    backend: str = "auto"
    cache: str | None = None
    policy: str = "lru"
    split: str | None = None
    ratio: float | None = None
    eta: float = 0.3
    preload: bool = True
    log_every: int = 0
    expert_format: str = "dense"
    cpu_activations: str = "auto"
    memory_floor: str | None = None
    default_cache_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.backend not in MOE_BACKENDS:
            raise ValueError(f"unknown --moe-backend {self.backend!r}; choose one of "
                             f"{', '.join(MOE_BACKENDS)}")
        if self.policy not in POLICIES:
            raise ValueError(f"unknown --moe-policy {self.policy!r}; choose one of "
                             f"{', '.join(POLICIES)}")
        if self.split is not None and self.split not in MODES:
            raise ValueError(f"unknown miss split {self.split!r}; choose one of {', '.join(MODES)}")
        if self.cache is not None:
            parse_cache_spec(self.cache)
        if self.ratio is not None and not self.ratio > 0:
            raise ValueError(f"split ratio must be > 0, got {self.ratio}")
        if self.expert_format not in EXPERT_FORMATS:
            raise ValueError(f"unknown --moe-expert-format {self.expert_format!r}; choose one of "
                             f"{', '.join(EXPERT_FORMATS)}")
        if self.cpu_activations not in CPU_ACTIVATION_CHOICES:
            raise ValueError(f"unknown --moe-cpu-activations {self.cpu_activations!r}; choose one "
                             f"of {', '.join(CPU_ACTIVATION_CHOICES)}")
        if self.cpu_activations == "q8" and self.expert_format not in ("mxfp4", "q4g"):
            raise ValueError(f"--moe-cpu-activations q8 needs 4-bit host expert banks: use "
                             f"--moe-expert-format mxfp4 or q4g (got {self.expert_format})")
        if self.cpu_activations == "bf16" and self.backend == "resident":
            raise ValueError("--moe-cpu-activations bf16 needs host expert banks: use "
                             "--moe-backend cpu or hybrid")
        if self.cpu_activations == "bf16" and self.expert_format != "dense":
            raise ValueError(f"--moe-cpu-activations bf16 needs bf16 host expert banks: use "
                             f"--moe-expert-format dense (got {self.expert_format})")
        if self.eta < 0 or self.log_every < 0:
            raise ValueError("eta and log_every must be >= 0")
        if self.memory_floor is not None:
            self.memory_floor_bytes()
            if self.backend == "resident":
                raise ValueError("--moe-memory-floor needs an expert cache: use --moe-backend "
                                 "offload, cpu or hybrid")

    def memory_floor_bytes(self) -> int | None:
        """``memory_floor`` in bytes (None without one).

        Raises:
            ValueError: not a positive size.
        """
        if self.memory_floor is None:
            return None
        try:
            return parse_bytes(str(self.memory_floor), require_unit=True)
        except ValueError as exc:
            reason = str(exc).split(": ", 1)[-1]  # drop parse_bytes' own "invalid size '…'" head
            raise ValueError(f"invalid --moe-memory-floor {self.memory_floor!r}: {reason}") from None


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


def parse_cache_spec(spec: str) -> tuple[str, float]:
    """``"96"`` -> ``("slots", 96)``, ``"0.25"`` -> ``("fraction", 0.25)``,
    ``"2GiB"`` -> ``("bytes", 2147483648)``.

    Raises:
        ValueError: anything else (zero slots, a fraction above 1, an unknown unit).
    """
    text = str(spec).strip()
    if _INT.match(text):
        if int(text) < 1:
            raise ValueError(f"invalid --moe-cache-slots {spec!r}: need at least 1 slot")
        return "slots", int(text)
    if _FRACTION.match(text) and text != ".":
        value = float(text)
        if not 0 < value <= 1:
            raise ValueError(f"invalid --moe-cache-slots {spec!r}: a fraction must be in (0, 1]")
        return "fraction", value
    try:
        return "bytes", parse_bytes(text)
    except ValueError:
        raise ValueError(f"invalid --moe-cache-slots {spec!r}: give slots (96), a fraction of all "
                         "experts (0.25) or a size (2GiB)") from None


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
