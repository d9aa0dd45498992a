"""Measured bandwidths of the offloaded MoE runtime's two miss paths (issue 3, ``freetoken profile``).

Per decode step the runtime splits the m missed experts: ``q* = round(m * B_P / B_H)`` are copied
into the device cache, the rest run on the CPU kernel. This module measures both rates on this
machine at a model's real expert shapes (gate_up ``[2I, H]`` + down ``[H, I]``):

* ``B_P`` (bytes / second): copying whole experts from a host bank into a separate pool tensor, row
  by row, in batches of 1, 4 and 8 experts (one decode step's worth of fills). On CUDA the bank is
  pinned and the copies are ``non_blocking`` and end with a synchronize; on CPU the pool is a
  second host tensor, so B_P is then a single-threaded host memcpy rate (what a CPU-only "device"
  cache costs; one intra-op thread, as multi-threaded copies stall 100x on a 2-core machine whose
  other core is busy).
* ``B_H`` (bytes / second): the CPU kernel (``freetoken.ops.cpu_moe.cpu.submit_banks`` /
  ``submit``, then ``.wait()``) on one token routed to top-k distinct experts, counting the expert
  weight bytes the kernel reads.

Bank size. The runtime's banks hold every routed expert of the model, gigabytes for real targets,
so both rates are measured in the streaming (DRAM) regime: the banks hold
``DEFAULT_BANK_BYTES`` = 256 MiB of experts (8x the 32 MiB last-level cache of a current desktop or
server CCD; at least ``2 * 8`` experts) and are walked in a seeded random permutation, so no
expert is re-read before the whole bank has been. A tiny checkpoint would fit in cache, but its
in-cache numbers would not transfer to the models the runtime serves.

Kernel dtype. B_H is measured on banks of ``bank_dtype``; a kernel build that rejects fp32 banks
(``TypeError``; builds without ``submit_banks``) is measured on bf16 instead, and the dtype
actually measured is stored as ``kernel_dtype``. Bandwidths use GB/s = 1e9 B/s.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path

import torch

from freetoken.models.config import ModelConfig
from freetoken.offload.profile_measure import banks, measure_copy, measure_kernel
from freetoken.paths import cache_dir

DEFAULT_BANK_BYTES = 256 * 2**20
BANK_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class MoeProfile:
    """Measured miss-path bandwidths for one model's expert shapes on this machine.

    Attributes:
        device: ``"cpu"`` or ``"cuda[:i]"`` (the pool's device for B_P).
        bank_dtype: dtype name of the host banks B_P copies (``"float32"`` / ``"bfloat16"``).
        hidden, intermediate: H and the expert width I.
        expert_bytes: bytes of one expert at ``bank_dtype``: ``3 * H * I * itemsize``.
        bandwidth_p_gbps: B_P, host bank -> pool copy rate, GB/s (1e9 B/s).
        bandwidth_h_gbps: B_H, CPU expert-kernel weight read rate, GB/s.
        cpu_threads: worker threads of the CPU kernel pool during the measurement.
        created: ISO-8601 UTC time of the measurement.
        model: the checkpoint directory measured.
        kernel_dtype: bank dtype B_H was measured with (bf16 when the kernel rejects fp32).
    """

    device: str
    bank_dtype: str
    hidden: int
    intermediate: int
    expert_bytes: int
    bandwidth_p_gbps: float
    bandwidth_h_gbps: float
    cpu_threads: int
    created: str
    model: str
    kernel_dtype: str = ""

    @property
    def ratio(self) -> float:
        """``B_P / B_H`` (dimensionless), the split factor of ``q* = round(m * B_P / B_H)``."""
        return self.bandwidth_p_gbps / self.bandwidth_h_gbps

    def to_json(self) -> str:
        """The profile as a JSON object string (one key per field)."""
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "MoeProfile":
        """Parse :meth:`to_json` output.

        Raises:
            ValueError: invalid JSON, not an object, a missing field or a field of the wrong type,
                or a non-positive / non-finite bandwidth.
        """
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"invalid JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise ValueError(f"a profile must be a JSON object, got {type(raw).__name__}")
        values = {}
        for f in fields(cls):
            if f.name not in raw:
                if f.name == "kernel_dtype":
                    continue
                raise ValueError(f"profile lacks field {f.name!r}")
            value = raw[f.name]
            kind = {"int": int, "float": (int, float), "str": str}[f.type]
            if isinstance(value, bool) or not isinstance(value, kind):
                raise ValueError(f"profile field {f.name!r} must be {f.type}, got {value!r}")
            values[f.name] = float(value) if f.type == "float" else value
        for name in ("bandwidth_p_gbps", "bandwidth_h_gbps"):
            if not 0 < values[name] < float("inf"):
                raise ValueError(f"profile field {name!r} must be positive and finite")
        return cls(**values)


def bank_dtype_for(compute_dtype: str) -> str:
    """Bank dtype of a compute dtype name: ``"bfloat16"`` for bf16, else ``"float32"``."""
    return "bfloat16" if compute_dtype == "bfloat16" else "float32"


def default_profile_path(model_path: str | Path, device: str, bank_dtype: str) -> Path:
    """``cache_dir()/profiles/<model dir>-<sha256(config.json)[:12]>-<device kind>-<dtype>.json``.

    The device kind is ``torch.device(device).type`` (``"cuda:1"`` and ``"cuda"`` share a file).

    Raises:
        FileNotFoundError: ``model_path`` has no ``config.json``.
    """
    model_path = Path(model_path).resolve()
    config = model_path / "config.json" if model_path.is_dir() else model_path
    digest = hashlib.sha256(config.read_bytes()).hexdigest()[:12]
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", config.parent.name) or "model"
    kind = torch.device(device).type
    return cache_dir() / "profiles" / f"{name}-{digest}-{kind}-{bank_dtype}.json"


def load_profile(path: str | Path) -> MoeProfile | None:
    """The profile stored at ``path``, or None when the file does not exist.

    Raises:
        ValueError: the file exists but is not a valid profile (the message names the file).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read MoE profile {path}: {exc}") from None
    try:
        return MoeProfile.from_json(text)
    except ValueError as exc:
        raise ValueError(f"corrupt MoE profile {path}: {exc}; delete it or rerun "
                         "`freetoken profile`") from exc


def save_profile(profile: MoeProfile, path: str | Path) -> Path:
    """Write ``profile.to_json()`` to ``path`` atomically (temp file + rename); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(profile.to_json(), encoding="utf-8")
    os.replace(tmp, path)
    return path


def measure_profile(
    config: ModelConfig,
    *,
    device: str = "cpu",
    bank_dtype: str = "bfloat16",
    seconds: float = 2.0,
    model: str = "",
    bank_bytes: int = DEFAULT_BANK_BYTES,
) -> MoeProfile:
    """Measure B_P and B_H at ``config``'s expert shapes (see the module docstring).

    Args:
        config: the model (H = ``hidden_size``, I = ``moe_intermediate_size``,
            k = ``num_experts_per_tok``).
        device: ``"cpu"`` or ``"cuda[:i]"``.
        bank_dtype: ``"float32"`` or ``"bfloat16"``.
        seconds: total wall-clock budget of the timed loops (split evenly between B_P and B_H;
            allocation and warm-up come on top, about 0.3 s for 256 MiB banks).
        model: the checkpoint path recorded in the result.
        bank_bytes: bytes of each bank pair (rounded down to whole experts, at least ``2 * k``).

    Raises:
        ValueError: a model without routed experts, an unknown device/dtype, a non-positive
            budget, or ``"cuda"`` without an available GPU.
    """
    if not config.num_experts:
        raise ValueError("the model has no routed experts to profile")
    try:
        kind = torch.device(device).type
    except RuntimeError:
        kind = None
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda[:i]', got {device!r}")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch.cuda.is_available() is False")
    if bank_dtype not in BANK_DTYPES:
        raise ValueError(f"bank_dtype must be one of {sorted(BANK_DTYPES)}, got {bank_dtype!r}")
    if not 0 < seconds <= 3600:
        raise ValueError(f"seconds must be in (0, 3600], got {seconds}")
    from freetoken.ops.cpu_moe import cpu

    hidden, inter, k = config.hidden_size, config.moe_intermediate_size, config.num_experts_per_tok
    dtype = BANK_DTYPES[bank_dtype]
    expert_bytes = 3 * hidden * inter * dtype.itemsize
    n = max(2 * k, bank_bytes // expert_bytes)
    gate_up, down = banks(n, hidden, inter, dtype, pin=kind == "cuda")
    b_p = measure_copy(gate_up, down, device, seconds / 2)
    kernel_dtype = bank_dtype
    try:
        b_h = measure_kernel(gate_up, down, k, seconds / 2)
    except TypeError:
        if dtype == torch.bfloat16:
            raise
        kernel_dtype = "bfloat16"
        del gate_up, down
        n = max(2 * k, bank_bytes // (expert_bytes // 2))
        gate_up, down = banks(n, hidden, inter, torch.bfloat16, pin=False)
        b_h = measure_kernel(gate_up, down, k, seconds / 2)
    return MoeProfile(
        device=device,
        bank_dtype=bank_dtype,
        hidden=hidden,
        intermediate=inter,
        expert_bytes=expert_bytes,
        bandwidth_p_gbps=b_p,
        bandwidth_h_gbps=b_h,
        cpu_threads=cpu.num_threads(),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        model=str(model),
        kernel_dtype=kernel_dtype,
    )
