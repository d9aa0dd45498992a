"""Read Hugging Face safetensors checkpoints with numpy only (no torch, no safetensors package).

The peer virtualenv that holds llama.cpp's Python binding and the ``gguf`` package has numpy but
not torch, so the GGUF converter (``convert_gguf.py``) reads the checkpoint through this module.

File format (the safetensors specification, huggingface/safetensors ``README.md`` "Format"):
8-byte little-endian header length N, N bytes of JSON ``{name: {"dtype", "shape",
"data_offsets": [begin, end]}, "__metadata__": {...}}``, then the raw little-endian tensor bytes,
offsets relative to the end of the header. Sharded checkpoints list ``name -> file`` in
``model.safetensors.index.json`` ("weight_map").
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

# safetensors dtype tag -> numpy storage dtype; BF16 has no numpy type and is kept as its raw
# uint16 bit pattern (see ``to_float32``).
_STORAGE = {
    "F32": np.float32,
    "F16": np.float16,
    "BF16": np.uint16,
    "F64": np.float64,
    "I64": np.int64,
    "I32": np.int32,
    "U8": np.uint8,  # MXFP4 codes and E8M0 scales (gpt-oss experts)
}


class SafetensorsCheckpoint:
    """Lazy, memory-mapped access to every tensor of a checkpoint directory.

    Args:
        model_dir: directory with ``model.safetensors`` or ``model.safetensors.index.json`` +
            shards (the layout ``freetoken make-tiny`` and Hugging Face write).

    Raises:
        FileNotFoundError: neither file exists.
        ValueError: a header is malformed, a dtype is not one of F32/F16/BF16/F64/I64/I32, or
            the index names a tensor its shard does not hold.
    """

    def __init__(self, model_dir: str | Path) -> None:
        self.model_dir = Path(model_dir)
        index = self.model_dir / "model.safetensors.index.json"
        single = self.model_dir / "model.safetensors"
        if index.is_file():
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            files = sorted(set(weight_map.values()))
        elif single.is_file():
            files = [single.name]
        else:
            raise FileNotFoundError(
                f"{self.model_dir} has neither model.safetensors nor model.safetensors.index.json")
        self._entries: dict[str, tuple[Path, int, dict]] = {}
        for name in files:
            path = self.model_dir / name
            header, data_start = _read_header(path)
            for key, meta in header.items():
                if key == "__metadata__":
                    continue
                if meta["dtype"] not in _STORAGE:
                    raise ValueError(f"{path}: tensor {key!r} has unsupported dtype {meta['dtype']}")
                self._entries[key] = (path, data_start, meta)
        if index.is_file():
            missing = sorted(set(weight_map) - set(self._entries))
            if missing:
                raise ValueError(f"index lists tensors no shard holds: {missing[:5]}")

    def names(self) -> list[str]:
        """All tensor names, sorted."""
        return sorted(self._entries)

    def dtype_tag(self, name: str) -> str:
        """The stored safetensors dtype tag of ``name`` (``"BF16"``, ``"F32"``, ...)."""
        return self._entries[name][2]["dtype"]

    def shape(self, name: str) -> tuple[int, ...]:
        """The stored shape of ``name`` (PyTorch order, e.g. ``[out_features, in_features]``)."""
        return tuple(self._entries[name][2]["shape"])

    def raw(self, name: str) -> np.ndarray:
        """The tensor as a read-only memory map in its storage dtype (BF16 as uint16 bits).

        Raises:
            KeyError: no tensor of that name.
        """
        path, data_start, meta = self._entries[name]
        begin, end = meta["data_offsets"]
        dtype = np.dtype(_STORAGE[meta["dtype"]]).newbyteorder("<")
        count = (end - begin) // dtype.itemsize
        arr = np.memmap(path, dtype=dtype, mode="r", offset=data_start + begin, shape=(count,))
        return arr.reshape(meta["shape"])

    def float32(self, name: str) -> np.ndarray:
        """The tensor converted exactly to float32 (bf16/f16 widen without rounding)."""
        return to_float32(self.raw(name), self.dtype_tag(name))


def to_float32(raw: np.ndarray, tag: str) -> np.ndarray:
    """Widen stored values to float32. BF16 is the top half of an IEEE float32, so shifting the
    uint16 bits left by 16 is exact; F16 and F32 go through numpy's own conversion.

    Args:
        raw: array in the storage dtype of ``tag`` (uint16 for BF16).
        tag: safetensors dtype tag.

    Returns:
        a new C-contiguous float32 array of the same shape.
    """
    if tag == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return np.ascontiguousarray(raw, dtype=np.float32)


def _read_header(path: Path) -> tuple[dict, int]:
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{path}: too short to be a safetensors file")
        (size,) = struct.unpack("<Q", head)
        try:
            header = json.loads(f.read(size))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: malformed safetensors header ({exc})") from exc
    return header, 8 + size
