"""The GGUF type of each planned tensor and its bytes, for ``convert_gguf.py``.

Types (``--outtype``): ``f32`` keeps every float exactly; ``bf16`` is exact for bf16 weights;
``f16`` rounds; ``mxfp4`` (MXFP4 checkpoints only, the gpt-oss releases) writes the experts as
ggml MXFP4 (the family plan sets ``Planned.qtype``) and every other matrix in its stored dtype:
bf16 bit patterns as stored, anything else as f32. In every mode 1-D tensors, biases, the routers
and the conv kernel stay f32: a rounded router can flip a top-k choice, ggml's CPU ``ssm_conv``
and ``add_id`` (the expert biases) read f32 only, and ggml's CPU adds 1-D tensors in f32.
"""

from __future__ import annotations

import gguf  # pinned gguf==0.19.0 in the peer venv
import numpy as np
from gguf.quants import quant_shape_to_byte_shape

from gguf_plan import Planned, T
from safetensors_np import SafetensorsCheckpoint

Q = gguf.GGMLQuantizationType
ALWAYS_F32 = {T.FFN_GATE_INP, T.FFN_GATE_INP_SHEXP, T.SSM_CONV1D}
FLOATS = {Q.F32: np.float32, Q.F16: np.float16, Q.BF16: np.uint16}  # numpy storage per type
OUTTYPES = {  # --outtype -> (type of the other matrices, general.file_type)
    "f32": (Q.F32, gguf.LlamaFileType.ALL_F32),
    "bf16": (Q.BF16, gguf.LlamaFileType.MOSTLY_BF16),
    "f16": (Q.F16, gguf.LlamaFileType.MOSTLY_F16),
    "mxfp4": (Q.BF16, gguf.LlamaFileType.MOSTLY_MXFP4_MOE),
}


def tensor_type(p: Planned, ckpt: SafetensorsCheckpoint, outtype: str) -> Q:
    """The GGUF type ``p`` is written in under ``outtype`` (module docstring)."""
    if p.qtype is not None:
        return p.qtype
    if len(p.shape) == 1 or p.kind in ALWAYS_F32 or p.name.endswith(".bias"):
        return Q.F32
    if outtype == "mxfp4" and not all(ckpt.dtype_tag(n) == "BF16" for n in p.hf):
        return Q.F32
    return OUTTYPES[outtype][0]


def stored_shape(p: Planned, qtype: Q) -> tuple[int, ...]:
    """The numpy shape of the array written for ``p``: its values' shape for the float types,
    uint8 bytes (the last axis in blocks) for a block-quantised one."""
    return p.shape if qtype in FLOATS else tuple(quant_shape_to_byte_shape(p.shape, qtype))


def add_tensor_info(w: gguf.GGUFWriter, p: Planned, qtype: Q) -> None:
    """Declare ``p`` in ``w``'s tensor table as ``qtype``."""
    shape = stored_shape(p, qtype)
    dtype = np.dtype(FLOATS.get(qtype, np.uint8))
    raw = None if qtype in (Q.F32, Q.F16) else qtype  # BF16 and quantised: raw bytes
    w.add_tensor_info(p.name, shape, dtype, int(np.prod(shape)) * dtype.itemsize, raw_dtype=raw)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even (finite inputs)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + (((u >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)


def encode(ckpt: SafetensorsCheckpoint, p: Planned, qtype: Q) -> np.ndarray:
    """Read, stack (if several), transform and encode the HF tensors of ``p`` as ``qtype``."""
    if p.parts is not None:
        x = p.parts([ckpt.raw(n) for n in p.hf])
        return x if qtype not in FLOATS else _from_float32(x, qtype)
    if qtype == Q.BF16 and all(ckpt.dtype_tag(n) == "BF16" for n in p.hf):
        parts = [np.asarray(ckpt.raw(n)) for n in p.hf]  # exact: keep the stored bits
        x = np.stack(parts) if len(parts) > 1 else parts[0]
        return np.ascontiguousarray(p.fn(x) if p.fn else x)
    parts = [ckpt.float32(n) for n in p.hf]
    x = np.stack(parts) if len(parts) > 1 else parts[0]
    return _from_float32(p.fn(x) if p.fn else x, qtype)


def _from_float32(x: np.ndarray, qtype: Q) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if qtype == Q.F32:
        return x
    if qtype == Q.F16:
        return x.astype(np.float16)
    return bf16_bits(x)
