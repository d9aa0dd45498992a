"""MoE backend settings (``--moe-*``): :class:`MoeConfig` and the cache size spec.

Torch-free, so ``freetoken serve`` checks its flags before anything heavy is imported; choosing
and building the backend from them is ``freetoken.offload.backend``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from freetoken.offload.control import MOE_BACKENDS, parse_bytes
from freetoken.offload.split import MODES

EXPERT_FORMATS = ("dense", "mxfp4", "q4g")  # host bank formats --moe-expert-format offers
POLICIES = ("lru", "lfu-decay")  # expert cache eviction policies (``offload.scores``)
# the CPU expert kernel's activations (``freetoken.ops.cpu_moe.ACTIVATIONS``, which loads the
# kernel; a test keeps the two equal)
CPU_ACTIVATIONS = ("fp32", "q8", "bf16")
CPU_ACTIVATION_CHOICES = ("auto", *CPU_ACTIVATIONS)
_INT = re.compile(r"^\s*\d+\s*$")
_FRACTION = re.compile(r"^\s*\d*\.\d*\s*$")


def _check_choice(label: str, value: str, choices: tuple[str, ...]) -> None:
    """ValueError ``unknown <label> '<value>'; choose one of <choices>`` unless ``value`` is one."""
    if value not in choices:
        raise ValueError(f"unknown {label} {value!r}; choose one of {', '.join(choices)}")


@dataclass(frozen=True)
class MoeConfig:
    """MoE backend settings (one frozen object, validated on construction).

    Attributes:
        backend: one of ``resident, offload, cpu, hybrid, auto``.
        cache: cache size spec (slots, fraction or bytes; see :func:`parse_cache_spec`) or None for the default.
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
        _check_choice("--moe-backend", self.backend, MOE_BACKENDS)
        _check_choice("--moe-policy", self.policy, POLICIES)
        if self.split is not None:
            _check_choice("miss split", self.split, MODES)
        if self.cache is not None:
            parse_cache_spec(self.cache)
        if self.ratio is not None and not self.ratio > 0:
            raise ValueError(f"split ratio must be > 0, got {self.ratio}")
        _check_choice("--moe-expert-format", self.expert_format, EXPERT_FORMATS)
        _check_choice("--moe-cpu-activations", self.cpu_activations, CPU_ACTIVATION_CHOICES)
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
