"""The tensor plan of a GGUF file, shared by ``convert_gguf.py`` and its family modules
(``gguf_glm4_moe.py``, ``gguf_gpt_oss.py``): which GGUF tensor is made of which checkpoint
tensors, in which shape, through which transform.

GGUF tensor names come from the ``gguf`` package (``gguf.TENSOR_NAMES``, e.g.
``blk.{bid}.attn_q``) plus a suffix: ``.weight`` unless :data:`SUFFIX` says otherwise or the
caller asks for another one (``.bias`` of the GLM q/k/v projections).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import gguf  # pinned gguf==0.19.0 in the peer venv
import numpy as np

T = gguf.MODEL_TENSOR
SUFFIX = {T.SSM_DT: ".bias", T.SSM_A: "", T.FFN_EXP_PROBS_B: ".bias"}


class ConversionError(ValueError):
    """The checkpoint cannot be expressed as a llama.cpp GGUF (message says why)."""


class Planned(NamedTuple):
    """One GGUF tensor: its name and kind, the HF tensors it is made of (several: stacked on a
    new axis 0, in expert order), the numpy shape of its values (ggml ne reversed) and the
    transform applied to the (stacked) array. Transforms that only reorder (``fn`` of a 2-D or
    larger tensor) also run on raw bf16 bit patterns; arithmetic ones are used on 1-D tensors,
    which are always read as float32.

    ``parts`` replaces the stacking: it gets the HF tensors in their storage dtype (uint8 MXFP4
    codes and scales, bf16 as uint16 bits) and returns either float32 values of ``shape`` or, when
    ``qtype`` is a block-quantised type, its bytes (``gguf.quant_shape_to_byte_shape(shape)``).
    ``qtype`` forces the GGUF type; None lets ``gguf_encode.tensor_type`` pick it."""

    name: str
    kind: gguf.MODEL_TENSOR
    hf: list[str]
    shape: tuple[int, ...]
    fn: Callable[[np.ndarray], np.ndarray] | None = None
    parts: Callable[[list[np.ndarray]], np.ndarray] | None = None
    qtype: gguf.GGMLQuantizationType | None = None


def tensor_name(kind: gguf.MODEL_TENSOR, bid: int | None = None,
                suffix: str | None = None) -> str:
    """GGUF name of ``kind`` (in block ``bid``), ending in ``suffix`` (default: :data:`SUFFIX`
    or ``.weight``)."""
    fmt = gguf.TENSOR_NAMES[kind]
    name = fmt.format(bid=bid) if bid is not None else fmt
    return name + (SUFFIX.get(kind, ".weight") if suffix is None else suffix)


def one(shapes: dict, hf: str, kind: gguf.MODEL_TENSOR, bid: int | None = None,
        fn: Callable[[np.ndarray], np.ndarray] | None = None,
        shape: tuple[int, ...] | None = None, suffix: str | None = None) -> Planned:
    """A GGUF tensor from one HF tensor; ``shape`` defaults to the stored one (a missing HF
    tensor gets shape () here and is reported by ``convert_gguf.plan_tensors``)."""
    return Planned(tensor_name(kind, bid, suffix), kind, [hf],
                   shapes.get(hf, ()) if shape is None else shape, fn)


def stacked(shapes: dict, names: list[str], kind: gguf.MODEL_TENSOR, bid: int) -> Planned:
    """A GGUF tensor stacking the HF tensors ``names`` (one per expert) on a new axis 0."""
    return Planned(tensor_name(kind, bid), kind, names, (len(names), *shapes.get(names[0], ())))
