"""MXFP4 expert weights in numpy: the released (Hugging Face) byte layout, its values, and ggml's
``block_mxfp4`` layout, for ``gguf_gpt_oss.py`` (numpy only, so the tests import it without the
``gguf`` package).

Both layouts cut a weight row into blocks of 32 consecutive elements: one E8M0 scale byte s and
16 bytes of E2M1 codes (OCP Microscaling Formats v1.0: code bit 3 the sign, bits 0-2 an index
into 0, 0.5, 1, 1.5, 2, 3, 4, 6), value ``e2m1(code) * 2^(s - 127)``.

* Hugging Face (gpt-oss ``*_blocks [..., nb, 16]`` + ``*_scales [..., nb]``, transformers
  ``convert_moe_packed_tensors``): byte j of a block holds element 2j in its low nibble and
  2j + 1 in its high nibble.
* ggml (``ggml/src/ggml-common.h`` ``block_mxfp4``, 17 bytes; ``dequantize_row_mxfp4`` in
  ``ggml-quants.c``): the scale byte, then ``qs[16]`` with element j in the low nibble of
  ``qs[j]`` and element j + 16 in its high nibble; the values are ``kvalues_mxfp4[code] *
  2^(s - 128)``, the table holding doubled E2M1 values, so the products are the same.
"""

from __future__ import annotations

import numpy as np

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)
BLOCK = 32  # elements per scale
GGML_BLOCK_BYTES = 17  # sizeof(block_mxfp4)


def repack_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """HF ``blocks [..., nb, 16]`` + ``scales [..., nb]`` (uint8) -> ggml ``block_mxfp4`` bytes
    ``[..., nb * 17]``: the same codes and scales, nibbles moved (module docstring)."""
    codes = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(*blocks.shape[:-1], BLOCK)
    packed = codes[..., :16] | (codes[..., 16:] << 4)
    out = np.concatenate([scales[..., None], packed], axis=-1)
    return np.ascontiguousarray(out.reshape(*blocks.shape[:-2], -1))


def dequantize_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """HF ``blocks [..., nb, 16]`` + ``scales [..., nb]`` -> float32 ``[..., nb * 32]``, exact
    (at most two significant bits times a power of two; scale 255 gives inf)."""
    values = np.stack([E2M1[blocks & 0x0F], E2M1[blocks >> 4]], axis=-1)
    values = values.reshape(*blocks.shape[:-1], BLOCK)
    with np.errstate(over="ignore"):
        values = np.ldexp(values, scales.astype(np.int32)[..., None] - 127).astype(np.float32)
    return values.reshape(*blocks.shape[:-2], -1)
