"""The manifest of a packed checkpoint (``freetoken convert``): what each expert bank file holds.

A packed checkpoint directory holds ``freetoken-packed.json`` (this manifest), the routed experts
as runtime host banks in one data file (``experts.ftw``), the other weights as safetensors and the
config, tokenizer and chat template files of the source. Every bank is the flat ``[N, ...]``
tensor of :class:`~freetoken.offload.banks.ExpertBanks` (``N = L * E``, row ``l * E + e`` is
expert ``e`` of MoE layer ``l``), starts at a 4 KiB aligned offset and is split into chunks that
never straddle two layers (a layer's rows are whole chunks), each with a CRC-32.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

MANIFEST_FILE = "freetoken-packed.json"
DATA_FILE = "experts.ftw"
FORMAT_NAME = "freetoken-packed"
VERSION = 1
ALIGN = 4096  # every bank starts at a multiple of this in its file
CHUNK_BYTES = 16 * 2**20
EXPERT_FORMATS = ("dense", "mxfp4", "nvfp4", "fp8")
ITEMSIZE = {"bfloat16": 2, "float32": 4, "uint8": 1, "float8_e4m3fn": 1}  # bytes per element
DTYPES = tuple(ITEMSIZE)


@dataclass(frozen=True)
class PackedBank:
    """One bank tensor in a data file.

    Attributes:
        name: ``gate_up`` / ``down`` (dense), ``gate_up.{k}`` / ``down.{k}`` (the k-th tensor of a
            quantised bank: codes, scales, row globals), ``gate_up_bias`` / ``down_bias``.
        file: the data file, relative to the checkpoint directory.
        shape: ``[N, ...]``; dtype: a torch dtype name (:data:`DTYPES`).
        offset: first byte in ``file`` (a multiple of :data:`ALIGN`); length: bytes.
        crc32: one CRC-32 per chunk, in file order (see :meth:`chunks`).
    """

    name: str
    file: str
    shape: tuple[int, ...]
    dtype: str
    offset: int
    length: int
    crc32: tuple[int, ...]

    def layer_bytes(self, num_layers: int) -> int:
        """Bytes of one MoE layer's rows."""
        return self.length // num_layers

    def chunks(self, num_layers: int, chunk_bytes: int,
               layers: range | None = None) -> list[tuple[int, int, int]]:
        """``(start, length, crc32)`` of every chunk of ``layers`` (default all), ``start``
        counted from the bank's first byte; a layer is cut into ``chunk_bytes`` pieces, its last
        one shorter."""
        per_layer = -(-self.layer_bytes(num_layers) // chunk_bytes)
        layers = range(num_layers) if layers is None else layers
        out = []
        for layer in layers:
            base = layer * self.layer_bytes(num_layers)
            for k in range(per_layer):
                start = k * chunk_bytes
                length = min(chunk_bytes, self.layer_bytes(num_layers) - start)
                out.append((base + start, length, self.crc32[layer * per_layer + k]))
        return out


@dataclass(frozen=True)
class PackedManifest:
    """What a packed checkpoint holds.

    Attributes:
        path: the checkpoint directory (not stored: where the manifest was read).
        version: :data:`VERSION` when written by this FreeToken.
        expert_format: the banks' format (:data:`EXPERT_FORMATS`).
        dtype: dense banks' dtype (``bfloat16`` when every expert is stored in bf16, else
            ``float32``); ``None`` for the others.
        stored_dtype: the source's safetensors dtype of the first MoE layer's expert 0
            (``BF16``, ``F8_E4M3``...): it picks the runtime's bank dtype, as for the source.
        moe_layers: decoder layer index of each MoE layer, in bank order (``l`` of ``l * E + e``).
        num_experts, hidden, intermediate: E, H, I.
        block: fp8's scale block ``(rows, cols)``, else None.
        biased: gpt-oss experts (the bias banks are present).
        chunk_bytes: the chunk size the checksums were taken over.
        banks: every bank tensor.
    """

    path: Path
    version: int
    expert_format: str
    dtype: str | None
    stored_dtype: str
    moe_layers: tuple[int, ...]
    num_experts: int
    hidden: int
    intermediate: int
    block: tuple[int, int] | None
    biased: bool
    chunk_bytes: int
    banks: tuple[PackedBank, ...]

    @property
    def num_layers(self) -> int:
        """L, MoE layers."""
        return len(self.moe_layers)

    @property
    def nbytes(self) -> int:
        """Bytes of every bank."""
        return sum(b.length for b in self.banks)

    def to_json(self) -> dict:
        """The manifest as stored (``path`` left out)."""
        body = asdict(self)
        body.pop("path")
        return {"format": FORMAT_NAME, **body}

    def write(self) -> None:
        """Write :data:`MANIFEST_FILE` into :attr:`path`."""
        text = json.dumps(self.to_json(), indent=1)
        (self.path / MANIFEST_FILE).write_text(text + "\n", encoding="utf-8")


def is_packed(path: str | Path) -> bool:
    """Whether ``path`` is a packed checkpoint directory (it holds :data:`MANIFEST_FILE`)."""
    return (Path(path) / MANIFEST_FILE).is_file()


def read_manifest(path: str | Path) -> PackedManifest:
    """The checked manifest of the packed checkpoint directory ``path``.

    Checks the version, the fields, and that every bank file exists and holds its bank's bytes;
    reads no bank data (checksums are verified as the banks are read).

    Raises:
        ValueError: not valid JSON, a version this FreeToken does not read, a malformed field, or
            a bank file shorter than its banks (``truncated``, naming the file and byte offset).
        FileNotFoundError: a bank file is missing.
    """
    path = Path(path)
    file = path / MANIFEST_FILE
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{file}: not valid JSON ({exc})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
        raise ValueError(f"{file}: not a FreeToken packed manifest (no \"format\": "
                         f"\"{FORMAT_NAME}\")")
    if raw.get("version") != VERSION:
        raise ValueError(f"{file}: packed format version {raw.get('version')!r} is not readable "
                         f"by this FreeToken (it reads version {VERSION}); convert the source "
                         f"checkpoint again with `freetoken convert`")
    try:
        manifest = _parse(path, raw)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{file}: malformed manifest ({exc!r})") from None
    check_files(manifest)
    return manifest


def _parse(path: Path, raw: dict) -> PackedManifest:
    banks = tuple(PackedBank(name=str(b["name"]), file=str(b["file"]),
                             shape=tuple(int(d) for d in b["shape"]), dtype=str(b["dtype"]),
                             offset=int(b["offset"]), length=int(b["length"]),
                             crc32=tuple(int(c) for c in b["crc32"]))
                  for b in raw["banks"])
    manifest = PackedManifest(
        path=path, version=int(raw["version"]), expert_format=str(raw["expert_format"]),
        dtype=raw["dtype"], stored_dtype=str(raw["stored_dtype"]),
        moe_layers=tuple(int(i) for i in raw["moe_layers"]),
        num_experts=int(raw["num_experts"]), hidden=int(raw["hidden"]),
        intermediate=int(raw["intermediate"]),
        block=None if raw["block"] is None else tuple(int(d) for d in raw["block"]),
        biased=bool(raw["biased"]), chunk_bytes=int(raw["chunk_bytes"]), banks=banks)
    if manifest.expert_format not in EXPERT_FORMATS:
        raise ValueError(f"expert_format {manifest.expert_format!r}")
    if manifest.chunk_bytes <= 0 or manifest.chunk_bytes % ALIGN:
        raise ValueError(f"chunk_bytes {manifest.chunk_bytes}")
    for b in banks:
        if b.dtype not in DTYPES or b.offset % ALIGN or b.length % manifest.num_layers:
            raise ValueError(f"bank {b.name!r}: dtype, offset or length")
        itemsize = ITEMSIZE[b.dtype]
        if math.prod(b.shape) * itemsize != b.length:
            raise ValueError(f"bank {b.name!r}: shape {list(b.shape)} of {b.dtype} is "
                             f"{math.prod(b.shape) * itemsize} bytes, length says {b.length}")
        chunks = -(-b.layer_bytes(manifest.num_layers) // manifest.chunk_bytes)
        if len(b.crc32) != chunks * manifest.num_layers:
            raise ValueError(f"bank {b.name!r}: {len(b.crc32)} checksums")
    return manifest


def check_files(manifest: PackedManifest) -> None:
    """Every bank file exists and is long enough for its banks.

    Raises:
        FileNotFoundError: a bank file is missing. ValueError: one is truncated.
    """
    for bank in manifest.banks:
        file = manifest.path / bank.file
        if not file.is_file():
            raise FileNotFoundError(f"{file}: bank file missing (bank {bank.name!r} of "
                                    f"{manifest.path / MANIFEST_FILE})")
        size = os.path.getsize(file)
        if size < bank.offset + bank.length:
            raise ValueError(f"{file}: truncated: bank {bank.name!r} needs bytes "
                             f"{bank.offset}..{bank.offset + bank.length} but the file ends at "
                             f"byte offset {size}")
