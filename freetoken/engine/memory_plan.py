"""The memory plan of ``freetoken serve``: every default budget derived from the memory the
machine has left once the weights are placed, and explicit budgets checked before loading.

Rule (``plan_memory``):

* A pool is what a memory has available (host: ``MemAvailable``, or the cgroup's limit less its
  usage when lower; CUDA: the driver's free memory) less the weights placed in it and a reserve
  of ``max(10% of its total, 1 GiB)``. On a CPU device the device *is* host memory: one pool,
  holding every weight. On a CUDA device the device pool holds the non-expert weights (and the
  routed experts when they stay resident), the host pool the routed-expert banks.
* Explicit budgets (``--kv-cache-bytes``, ``--state-checkpoint-bytes``) are taken from their pool
  in that order; one that does not fit what is left refuses the start (:class:`PlanError`).
* Defaults: the KV pool's cap is a quarter of its pool (device), the host checkpoint tier a
  quarter of the host pool (never negative); the device expert cache takes what the device pool
  has left after the KV pool (its own rule in ``freetoken.offload.loading`` sizes it).
* Weights before load are the checkpoint's tensors (safetensors headers): floating tensors at the
  compute dtype's width, others (quantised blocks, scales) as stored.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from freetoken.units import format_bytes

GiB = 1 << 30
RESERVE_FRACTION = 0.10
RESERVE_MIN = 1 * GiB
KV_FRACTION = 0.25
CHECKPOINT_HOST_FRACTION = 0.25
_ROUTED_EXPERT = re.compile(r"\.experts\.")
_FLOAT_WIDTH = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2}
_DTYPE_WIDTH = {**_FLOAT_WIDTH, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
                "F8_E4M3": 1, "F8_E5M2": 1, "U32": 4, "U16": 2}


class PlanError(ValueError):
    """An explicit budget does not fit; the message is the one line ``serve`` prints."""


@dataclass(frozen=True)
class HostMemory:
    """Host memory in bytes: ``total`` (``MemTotal``, or the cgroup limit when lower) and
    ``available`` (``MemAvailable``, or the cgroup's limit less its usage when lower)."""

    total: int
    available: int


@dataclass(frozen=True)
class DeviceMemory:
    """A CUDA device's ``total`` and driver-``free`` bytes (``torch.cuda.mem_get_info``)."""

    total: int
    free: int


@dataclass(frozen=True)
class WeightBytes:
    """Bytes of the model's weights: ``experts`` (routed experts, the host banks when offloaded)
    and ``other`` (everything else: attention, norms, embeddings, shared experts)."""

    experts: int
    other: int

    @property
    def total(self) -> int:
        return self.experts + self.other


@dataclass(frozen=True)
class Budgets:
    """Explicit budgets from flags; None takes the plan's default."""

    kv_cache_bytes: int | None = None
    checkpoint_host_bytes: int | None = None


@dataclass(frozen=True)
class MemoryPlan:
    """Where the memory goes (bytes). ``device`` is ``"cpu"`` (one pool: host memory) or a
    CUDA device; ``*_left`` is what no budget claims (negative: the weights alone do not fit).

    ``kv_cache_bytes`` is the KV pool's cap (the pool holds ``--max-running-requests``
    full-length sequences within it, see ``freetoken.prefix.build``), ``expert_cache_bytes`` the
    device room the expert cache may take (0 on a CPU device or with resident experts).
    """

    device: str
    host_total: int
    host_available: int
    device_total: int
    device_available: int
    weights_device: int
    weights_host: int
    expert_banks: int
    expert_cache_bytes: int
    kv_cache_bytes: int
    kv_explicit: bool
    checkpoint_slots: int
    checkpoint_host_bytes: int
    checkpoint_host_explicit: bool
    reserve_host: int
    reserve_device: int
    host_left: int
    device_left: int

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu"

    def as_dict(self) -> dict:
        """The plan as JSON-ready fields (``GET /v1/freetoken/memory``'s ``plan``)."""
        return asdict(self)

    def table(self) -> list[str]:
        """The start-up table: one aligned line per budget (what, where, bytes, how decided)."""
        dev = "host (cpu device)" if self.on_cpu else self.device
        kv = "--kv-cache-bytes" if self.kv_explicit else "cap: 25% of the pool"
        ckpt = ("--state-checkpoint-bytes" if self.checkpoint_host_explicit
                else "25% of the host pool")
        rows = [("available", "host", self.host_available, f"of {format_bytes(self.host_total)}")]
        if not self.on_cpu:
            rows.append(("available", dev, self.device_available,
                         f"of {format_bytes(self.device_total)}"))
        rows += [("weights", dev, self.weights_device,
                  "all tensors" if self.on_cpu else "non-expert tensors")]
        if not self.on_cpu:
            rows.append(("expert banks", "host", self.expert_banks, "routed experts"))
            rows.append(("expert cache", dev, self.expert_cache_bytes, "up to: the rest"))
        rows += [("KV pool", dev, self.kv_cache_bytes, kv),
                 ("checkpoints", dev, None, f"{self.checkpoint_slots} slots"),
                 ("checkpoints", "host", self.checkpoint_host_bytes, ckpt)]
        rows.append(("reserve", "host", self.reserve_host, "max(10% of total, 1 GiB)"))
        if not self.on_cpu:
            rows.append(("reserve", dev, self.reserve_device, "max(10% of total, 1 GiB)"))
        rows.append(("left", "host", self.host_left, ""))
        if not self.on_cpu:
            rows.append(("left", dev, self.device_left, ""))
        lines = ["memory plan:"]
        for what, where, size, how in rows:
            shown = "-" if size is None else _signed(size)
            lines.append(f"  {what:<13}{where:<18}{shown:>11}  {how}".rstrip())
        return lines


def _signed(num_bytes: int) -> str:
    return format_bytes(num_bytes) if num_bytes >= 0 else "-" + format_bytes(-num_bytes)


def reserve_for(total: int) -> int:
    """The safety reserve of a memory of ``total`` bytes: 10% of it, at least 1 GiB."""
    return max(int(total * RESERVE_FRACTION), RESERVE_MIN)


class _Pool:
    """A pool's bytes after weights and reserve; explicit budgets are taken in order."""

    def __init__(self, available: int, weights: int, reserve: int) -> None:
        self.weights, self.reserve = weights, reserve
        self.left = available - weights - reserve
        self.taken: list[tuple[str, int]] = []

    def take(self, flag: str, need: int) -> int:
        if need > self.left:
            after = [f"{format_bytes(self.weights)} of weights",
                     f"a {format_bytes(self.reserve)} reserve"]
            after += [f"{format_bytes(n)} of {f}" for f, n in self.taken]
            joined = ", ".join(after[:-1]) + " and " + after[-1]
            raise PlanError(f"{flag} {format_bytes(need)} does not fit: "
                            f"{_signed(self.left)} available after {joined}")
        self.left -= need
        self.taken.append((flag, need))
        return need


def plan_memory(host: HostMemory, device: DeviceMemory | None, weights: WeightBytes,
                budgets: Budgets = Budgets(), *, experts_resident: bool | None = None,
                checkpoint_slots: int = 8, device_name: str = "cpu") -> MemoryPlan:
    """The plan for ``weights`` on ``device`` (None: a CPU device) with ``budgets`` (rule: see the
    module docstring).

    Args:
        experts_resident: on a CUDA device, whether the routed experts stay on the device; None
            decides as ``--moe-backend auto`` does: when all weights fit the device pool.

    Raises:
        PlanError: an explicit budget does not fit its pool.
    """
    hpool_reserve = reserve_for(host.total)
    if device is None:
        pool = _Pool(host.available, weights.total, hpool_reserve)
        kv = pool.take("--kv-cache-bytes", budgets.kv_cache_bytes) \
            if budgets.kv_cache_bytes is not None else None
        ckpt = pool.take("--state-checkpoint-bytes", budgets.checkpoint_host_bytes) \
            if budgets.checkpoint_host_bytes is not None else None
        base = max(0, pool.left)
        if kv is None:
            kv = int(base * KV_FRACTION)
        if ckpt is None:
            ckpt = int(base * CHECKPOINT_HOST_FRACTION)
        left = pool.left - (kv if budgets.kv_cache_bytes is None else 0) \
            - (ckpt if budgets.checkpoint_host_bytes is None else 0)
        return MemoryPlan(
            device="cpu", host_total=host.total, host_available=host.available,
            device_total=host.total, device_available=host.available,
            weights_device=weights.total, weights_host=0, expert_banks=0, expert_cache_bytes=0,
            kv_cache_bytes=kv, kv_explicit=budgets.kv_cache_bytes is not None,
            checkpoint_slots=checkpoint_slots, checkpoint_host_bytes=ckpt,
            checkpoint_host_explicit=budgets.checkpoint_host_bytes is not None,
            reserve_host=hpool_reserve, reserve_device=0, host_left=left, device_left=left)
    dreserve = reserve_for(device.total)
    if experts_resident is None:
        experts_resident = weights.total <= device.free - dreserve
    on_device = weights.total if experts_resident else weights.other
    banks = 0 if experts_resident else weights.experts
    dpool = _Pool(device.free, on_device, dreserve)
    hpool = _Pool(host.available, banks, hpool_reserve)
    if budgets.kv_cache_bytes is not None:
        kv = dpool.take("--kv-cache-bytes", budgets.kv_cache_bytes)
    else:
        kv = int(max(0, dpool.left) * KV_FRACTION)
        dpool.left -= kv
    if budgets.checkpoint_host_bytes is not None:
        ckpt = hpool.take("--state-checkpoint-bytes", budgets.checkpoint_host_bytes)
    else:
        ckpt = int(max(0, hpool.left) * CHECKPOINT_HOST_FRACTION)
        hpool.left -= ckpt
    cache = 0 if experts_resident else max(0, dpool.left)
    return MemoryPlan(
        device=device_name, host_total=host.total, host_available=host.available,
        device_total=device.total, device_available=device.free, weights_device=on_device,
        weights_host=banks, expert_banks=banks, expert_cache_bytes=cache, kv_cache_bytes=kv,
        kv_explicit=budgets.kv_cache_bytes is not None, checkpoint_slots=checkpoint_slots,
        checkpoint_host_bytes=ckpt,
        checkpoint_host_explicit=budgets.checkpoint_host_bytes is not None,
        reserve_host=hpool_reserve, reserve_device=dreserve, host_left=hpool.left,
        device_left=dpool.left - cache)


# --- readers (injectable in tests) ---------------------------------------------------------------

def read_meminfo(text: str | None = None) -> dict[str, int]:
    """``/proc/meminfo`` (or ``text``) as bytes per field (``MemTotal``, ``MemAvailable``...)."""
    if text is None:
        text = Path("/proc/meminfo").read_text()
    out = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[name.strip()] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return out


def _read_int(path: Path) -> int | None:
    try:
        raw = path.read_text().strip()
    except OSError:
        return None
    return int(raw) if raw.isdigit() else None  # "max": no limit


def host_memory(meminfo: Callable[[], dict[str, int]] = read_meminfo,
                cgroup: Path = Path("/sys/fs/cgroup")) -> HostMemory:
    """Host total and available bytes: ``/proc/meminfo``, bounded by the cgroup v2 limit
    (``memory.max`` less ``memory.current``) when one is set and lower."""
    info = meminfo()
    total, available = info["MemTotal"], info.get("MemAvailable", info.get("MemFree", 0))
    limit = _read_int(cgroup / "memory.max")
    if limit is not None:
        used = _read_int(cgroup / "memory.current") or 0
        total, available = min(total, limit), min(available, max(0, limit - used))
    return HostMemory(total=total, available=available)


def checkpoint_weight_bytes(path: Path, compute_width: int, manifest=None) -> WeightBytes:
    """Weight bytes of the checkpoint folder ``path`` from its safetensors headers (no tensor
    is read): floating tensors at ``compute_width`` bytes per element, others as stored; a
    packed checkpoint's banks from ``manifest`` (its ``PackedManifest``, read here when None).
    An unreadable header counts nothing: the loader reports the file properly."""
    experts = other = 0
    for file in sorted(Path(path).glob("*.safetensors")):
        try:
            with open(file, "rb") as f:
                (size,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(size))
        except (OSError, ValueError, struct.error):
            continue
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            start, end = meta["data_offsets"]
            nbytes = end - start
            width = _FLOAT_WIDTH.get(meta["dtype"])
            if width is not None:
                nbytes = nbytes // width * compute_width
            if _ROUTED_EXPERT.search(name):
                experts += nbytes
            else:
                other += nbytes
    return WeightBytes(experts=experts + _packed_expert_bytes(Path(path), compute_width,
                                                              manifest),
                       other=other)


def _packed_expert_bytes(path: Path, compute_width: int, manifest=None) -> int:
    """Bytes of a packed checkpoint's expert banks (floating ones at ``compute_width``, as the
    safetensors headers are counted), 0 for a plain checkpoint or an unreadable manifest (the
    loader reports it properly)."""
    from freetoken.packed.manifest import is_packed, read_manifest

    if manifest is None:
        if not is_packed(path):
            return 0
        try:
            manifest = read_manifest(path)
        except (OSError, ValueError):
            return 0
    width = {"bfloat16": 2, "float32": 4}
    return sum(b.length // width[b.dtype] * compute_width if b.dtype in width else b.length
               for b in manifest.banks)
