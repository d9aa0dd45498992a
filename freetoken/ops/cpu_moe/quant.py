"""Torch quantisers and exact dequantisers of the quantised expert weight formats (the reference).

Every format quantises a weight matrix ``w [..., R, C]`` (R output rows, C input columns: H for
``gate_up``, I for ``down``) in blocks of consecutive input columns; the 4-bit ones pack two codes
per byte, **low nibble = even column**. Dequantising mxfp4 and q4g is exact in fp32 (every value
is a small integer times a power of two or an fp16 scale), so the kernel is compared with fp32
math on exactly these values; fp8 and nvfp4 dequantise to the fp32 values of their published
dequantisers (one rounding of a product with an fp32 scale, below).

* ``mxfp4`` (OCP Microscaling FP4, the gpt-oss checkpoint layout read by transformers
  ``integrations/mxfp4.py``): groups of 32; ``blocks`` uint8 ``[..., R, C/32, 16]`` hold FP4
  e2m1 codes (bit 3 sign, bits 0-2 index into ``{0, 0.5, 1, 1.5, 2, 3, 4, 6}``), ``scales`` uint8
  ``[..., R, C/32]`` E8M0 exponents, value ``2^(s - 127)``. The byte 255 (E8M0 NaN) is never
  produced and not supported by the kernel.
* ``q4g`` (this project's group-quantised int4, in the spirit of GPTQ/AWQ int4 and llama.cpp
  Q4_0/Q4_1): groups of ``group_size`` (a multiple of 32, default 32); ``packed`` uint8
  ``[..., R, C/2]`` codes ``q`` in ``[0, 15]``; ``scales`` float16 ``[..., R, C/G]``; optional
  ``zeros`` uint8 ``[..., R, C/G]`` in ``[0, 15]``. ``w = (q - z) * scale`` with ``z = 8`` when
  symmetric (no ``zeros`` tensor). Symmetric: ``scale = absmax / 7`` (codes 1..15).
  Asymmetric: ``scale = (max - min) / 15`` over the group's range widened to include 0,
  ``z = round(-min / scale)``.
* ``fp8`` (the official -FP8 releases, transformers ``FineGrainedFP8``, ``quant_method: fp8``,
  ``weight_block_size [bm, bn]``, 128 x 128 in the releases): ``values`` float8_e4m3fn
  ``[..., R, C]``, ``scales`` float32 ``[..., ceil(R/bm), ceil(C/bn)]`` (the checkpoints'
  ``*_scale_inv``); ``w[r, c] = e4m3(v) * scales[r // bm, c // bn]``. Any ``bm, bn >= 1``; the
  last block of a row or column may be partial, as in transformers' ``FP8Linear`` /
  ``_dequantize_fp8_weight`` (its ``Fp8Dequantize`` and ``loader.dequantize_blocks`` need
  grids that divide the weight, the case of every release).
* ``nvfp4`` (NVIDIA ModelOpt NVFP4, e.g. the ``nvidia/*-NVFP4`` checkpoints, per linear
  ``weight`` uint8 ``[R, C/2]``, ``weight_scale`` float8_e4m3fn ``[R, C/16]``, ``weight_scale_2``
  fp32 scalar): ``packed`` uint8 ``[..., R, C/2]`` e2m1 codes (as mxfp4; nibble order checked
  against ModelOpt ``NVFP4QTensor`` and vLLM ``break_fp4_bytes``), ``scales`` float8_e4m3fn
  ``[..., R, C/16]``, ``global`` float32 ``[..., R]``: each row carries its matrix's
  ``weight_scale_2`` (a fused gate_up keeps gate's and up's apart, exactly).
  ``w = e2m1(code) * e4m3(s) * global``; C a multiple of 16. The checkpoints' ``input_scale``
  (activation quantisation, W4A4) has no role: the kernel multiplies fp32 activations.
"""
from __future__ import annotations

import torch

# e2m1 magnitudes by 3-bit index, and the midpoints between neighbours (for round-to-nearest).
FP4_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_FP4_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
MXFP4_GROUP = 32
NVFP4_GROUP = 16
FP8_MAX = 448.0  # largest finite float8 e4m3fn magnitude


def _check_weight(w: torch.Tensor, fmt: str, group: int) -> torch.Tensor:
    if not isinstance(w, torch.Tensor) or not w.is_floating_point():
        raise TypeError(f"{fmt}: w must be a floating-point torch.Tensor")
    if w.dim() < 1 or w.shape[-1] % group != 0:
        raise ValueError(
            f"{fmt}: the input dimension (last, size {w.shape[-1] if w.dim() else 0}) must be a "
            f"multiple of the group size {group}"
        )
    w = w.detach().to("cpu", torch.float64)
    if not torch.isfinite(w).all():
        raise ValueError(f"{fmt}: w must be finite")
    return w


def _pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """``[..., C]`` codes in [0, 15] -> ``[..., C/2]`` uint8, low nibble = even column."""
    codes = codes.to(torch.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def _unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """``[..., C/2]`` uint8 -> ``[..., C]`` int64 codes in column order."""
    lo = (packed & 0x0F).long()
    hi = (packed >> 4).long()
    return torch.stack([lo, hi], dim=-1).flatten(-2)


def _e2m1_index(a: torch.Tensor) -> torch.Tensor:
    """Magnitudes ``a >= 0`` -> int64 index of the nearest e2m1 magnitude (ties to the even
    index, i.e. the even code; beyond 6 saturates at 6). The same as ModelOpt's ``_cast_fp4``:
    its ``searchsorted`` over the midpoints plus one at the odd midpoints 0.75, 1.75, 3.5."""
    mids = torch.tensor(_FP4_MIDPOINTS, dtype=a.dtype)
    idx = torch.bucketize(a, mids)  # ties go to the lower index
    tie = (idx < len(mids)) & (a == mids[idx.clamp(max=len(mids) - 1)])
    return torch.where(tie & (idx % 2 == 1), idx + 1, idx)


def _e8m0_to_f32(scales: torch.Tensor) -> torch.Tensor:
    """uint8 E8M0 ``s`` -> fp32 ``2^(s - 127)`` built from its bits (exact; s=0 is subnormal)."""
    s = scales.to(torch.int32)
    bits = torch.where(s > 0, s << 23, torch.full_like(s, 0x00400000))
    return bits.view(torch.float32)


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise ``w [..., R, C]`` to MXFP4 (gpt-oss layout), round-to-nearest-even per element.

    Each group of 32 input columns gets the smallest power-of-two scale ``2^e`` with
    ``absmax <= 6 * 2^e`` (E8M0 byte ``e + 127``, clamped to [0, 254]); elements are divided by it
    and rounded to the nearest e2m1 value (ties to the even code), saturating at 6.
    Values already on the grid (``dequantize_mxfp4`` outputs) round-trip exactly.

    Returns:
        ``(blocks, scales)``: uint8 ``[..., R, C/32, 16]`` and uint8 ``[..., R, C/32]`` (CPU).

    Raises:
        TypeError: ``w`` is not a floating-point tensor.
        ValueError: ``C`` is not a multiple of 32, or ``w`` has a NaN/inf.
    """
    w = _check_weight(w, "mxfp4", MXFP4_GROUP)
    g = w.reshape(*w.shape[:-1], w.shape[-1] // MXFP4_GROUP, MXFP4_GROUP)  # [..., C/32, 32]
    amax = g.abs().amax(-1)
    mant, exp = torch.frexp(amax / 6.0)  # amax / 6 = mant * 2^exp, mant in [0.5, 1)
    e = exp.long() - (mant == 0.5).long()  # ceil(log2(amax / 6))
    s = torch.where(amax > 0, e + 127, torch.zeros_like(e)).clamp(0, 254)
    v = torch.ldexp(g, -(s - 127)[..., None].double())
    idx = _e2m1_index(v.abs())
    codes = idx | torch.where((v < 0) & (idx > 0), 8, 0)
    blocks = _pack_nibbles(codes).reshape(*g.shape[:-1], MXFP4_GROUP // 2)
    return blocks.contiguous(), s.to(torch.uint8).contiguous()


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """MXFP4 ``blocks [..., R, C/32, 16]`` and ``scales [..., R, C/32]`` (uint8) -> fp32
    ``[..., R, C]``.

    ``w = e2m1(code) * 2^(s - 127)``, exact in fp32 (E8M0 255 gives inf, not NaN).

    Raises:
        TypeError: a tensor is not uint8.
        ValueError: shapes disagree (``blocks.shape[:-1] != scales.shape`` or last dim != 16).
    """
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise TypeError(f"mxfp4 blocks and scales must be uint8, got {blocks.dtype} and "
                        f"{scales.dtype}")
    if blocks.dim() < 2 or blocks.shape[-1] != 16 or blocks.shape[:-1] != scales.shape:
        raise ValueError(f"mxfp4 blocks {list(blocks.shape)} and scales {list(scales.shape)} must "
                         f"be [..., C/32, 16] and [..., C/32]")
    lut = torch.tensor(FP4_MAGNITUDES + tuple(-m for m in FP4_MAGNITUDES), dtype=torch.float32)
    vals = lut[_unpack_nibbles(blocks)]  # [..., C/32, 32]
    out = vals * _e8m0_to_f32(scales)[..., None]
    return out.flatten(-2)


def quantize_q4g(
    w: torch.Tensor, *, group_size: int = 32, symmetric: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Quantise ``w [..., R, C]`` to q4g with one fp16 scale (and zero point) per group.

    Codes are ``round(w / scale) + z`` (round half to even) clamped to [0, 15], computed with the
    fp16-rounded scale so dequantisation uses exactly the stored scale. Values already on the grid
    (``(q - z) * scale`` with the group's extreme codes present: q in {1, 15} symmetric, {0, 15}
    asymmetric) round-trip exactly.

    Args:
        w: ``[..., R, C]`` float weights; C is the input dimension (H for gate_up, I for down).
        group_size: columns per group, a positive multiple of 32 dividing C.
        symmetric: zero point fixed at 8 (no ``zeros`` tensor) when True.

    Returns:
        ``(packed, scales, zeros)``: uint8 ``[..., R, C/2]``, float16 ``[..., R, C/G]`` and uint8
        ``[..., R, C/G]`` (``None`` when symmetric).

    Raises:
        TypeError: ``w`` is not a floating-point tensor.
        ValueError: bad ``group_size``, C not a multiple of it, non-finite ``w``, or a scale that
            overflows float16.
    """
    if not isinstance(group_size, int) or group_size <= 0 or group_size % 32 != 0:
        raise ValueError(f"q4g: group_size must be a positive multiple of 32, got {group_size}")
    w = _check_weight(w, "q4g", group_size)
    g = w.reshape(*w.shape[:-1], w.shape[-1] // group_size, group_size)  # [..., C/G, G]
    if symmetric:
        scale = g.abs().amax(-1) / 7.0
    else:
        lo = g.amin(-1).clamp(max=0.0)
        hi = g.amax(-1).clamp(min=0.0)
        scale = (hi - lo) / 15.0
    scale16 = scale.to(torch.float16)
    if not torch.isfinite(scale16).all():
        raise ValueError("q4g: a group scale overflows float16 (|w| too large)")
    s = scale16.double()[..., None]
    safe = torch.where(s > 0, s, torch.ones_like(s))
    if symmetric:
        zero = torch.full(s.shape, 8.0, dtype=torch.float64)
    else:
        zero = torch.round(-lo[..., None] / safe).clamp(0, 15)
    q = torch.where(s > 0, torch.round(g / safe) + zero, zero).clamp(0, 15)
    packed = _pack_nibbles(q.flatten(-2))
    zeros = None if symmetric else zero[..., 0].to(torch.uint8).contiguous()
    return packed.contiguous(), scale16.contiguous(), zeros


def dequantize_q4g(
    packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None = None
) -> torch.Tensor:
    """q4g ``packed [..., R, C/2]`` (uint8), ``scales [..., R, C/G]`` (float16) and optional
    ``zeros [..., R, C/G]`` (uint8; ``None`` = symmetric, z = 8) -> fp32 ``[..., R, C]``.

    ``w = (q - z) * scale``, exact in fp32.

    Raises:
        TypeError: wrong dtypes.
        ValueError: shapes disagree, or the group size ``C / scales.shape[-1]`` is not an integer
            multiple of 32.
    """
    if packed.dtype != torch.uint8 or scales.dtype != torch.float16:
        raise TypeError(f"q4g packed must be uint8 and scales float16, got {packed.dtype} and "
                        f"{scales.dtype}")
    if zeros is not None and zeros.dtype != torch.uint8:
        raise TypeError(f"q4g zeros must be uint8, got {zeros.dtype}")
    cols = 2 * packed.shape[-1] if packed.dim() else 0
    ngroups = scales.shape[-1] if scales.dim() else 0
    if (packed.dim() < 1 or scales.shape[:-1] != packed.shape[:-1] or ngroups == 0
            or cols % ngroups != 0 or (cols // ngroups) % 32 != 0
            or (zeros is not None and zeros.shape != scales.shape)):
        raise ValueError(f"q4g packed {list(packed.shape)}, scales {list(scales.shape)} and zeros "
                         f"{None if zeros is None else list(zeros.shape)} must be [..., C/2], "
                         f"[..., C/G] and [..., C/G] with G a multiple of 32")
    group = cols // ngroups
    q = _unpack_nibbles(packed).reshape(*scales.shape, group).float()
    z = 8.0 if zeros is None else zeros.float()[..., None]
    return ((q - z) * scales.float()[..., None]).flatten(-2)


def _cdiv(n: int, block: int) -> int:
    return -(-n // block)


def _check_block(block_size: object) -> tuple[int, int]:
    """``block_size`` as ``(bm, bn)``; ValueError unless two positive ints."""
    ok = (isinstance(block_size, (tuple, list)) and len(block_size) == 2
          and all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in block_size))
    if not ok:
        raise ValueError(f"fp8: block_size must be two positive integers (bm, bn), got "
                         f"{block_size!r}")
    return int(block_size[0]), int(block_size[1])


def quantize_fp8_blocks(
    w: torch.Tensor, block_size: tuple[int, int] = (128, 128)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise ``w [..., R, C]`` to fp8 blocks as the official -FP8 releases store them.

    Per block of ``bm x bn`` (rows x input columns; the last block of each axis covers what is
    left, as transformers' ``FP8Linear`` allocates its ``ceil``-sized scale grid), in fp32:
    ``scale = amax / 448`` (1 for an all-zero block), values ``clamp(w / scale, -448, 448)``
    rounded to the nearest float8 e4m3fn (torch's cast, ties to even), as
    ``freetoken/models/tiny_fp8.py`` and transformers ``Fp8Quantize`` do.

    Returns:
        ``(values [..., R, C] float8_e4m3fn, scales [..., ceil(R/bm), ceil(C/bn)] float32)``,
        contiguous, CPU.

    Raises:
        TypeError: ``w`` is not a floating-point tensor.
        ValueError: ``w`` has fewer than 2 dims or a NaN/inf; bad ``block_size``.
    """
    bm, bn = _check_block(block_size)
    if not isinstance(w, torch.Tensor) or not w.is_floating_point():
        raise TypeError("fp8: w must be a floating-point torch.Tensor")
    if w.dim() < 2:
        raise ValueError(f"fp8: w must be [..., R, C], got shape {list(w.shape)}")
    w = w.detach().to("cpu", torch.float32)
    if not torch.isfinite(w).all():
        raise ValueError("fp8: w must be finite")
    *lead, rows, cols = w.shape
    gr, gc = _cdiv(rows, bm), _cdiv(cols, bn)
    padded = torch.zeros(*lead, gr * bm, gc * bn)  # zeros leave every block's amax unchanged
    padded[..., :rows, :cols] = w
    blocks = padded.reshape(*lead, gr, bm, gc, bn)
    amax = blocks.abs().amax(dim=(-3, -1))  # [..., gr, gc]
    scales = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (blocks / scales[..., :, None, :, None]).clamp(-FP8_MAX, FP8_MAX)
    values = q.reshape(padded.shape)[..., :rows, :cols].to(torch.float8_e4m3fn)
    return values.contiguous(), scales.contiguous()


def dequantize_fp8_blocks(
    values: torch.Tensor, scales: torch.Tensor, block_size: tuple[int, int]
) -> torch.Tensor:
    """fp8 ``values [..., R, C]`` (float8_e4m3fn) and ``scales [..., ceil(R/bm), ceil(C/bn)]``
    (float32) -> fp32 ``[..., R, C]``, ``w[r, c] = e4m3(values[r, c]) * scales[r // bm, c // bn]``.

    The e4m3 decode is exact (NaN codes give NaN) and the product is rounded once to fp32: the
    values transformers' ``_dequantize_fp8_weight`` (fp32, ragged last blocks included) and
    ``Fp8Dequantize`` / ``freetoken.models.loader.dequantize_blocks`` (divisible grids) compute.

    Raises:
        TypeError: wrong dtypes.
        ValueError: bad ``block_size``, or ``scales`` is not the ``ceil`` grid of ``values``.
    """
    bm, bn = _check_block(block_size)
    if values.dtype != torch.float8_e4m3fn or scales.dtype != torch.float32:
        raise TypeError(f"fp8 values must be float8_e4m3fn and scales float32, got "
                        f"{values.dtype} and {scales.dtype}")
    if values.dim() < 2:
        raise ValueError(f"fp8 values must be [..., R, C], got shape {list(values.shape)}")
    *lead, rows, cols = values.shape
    want = [*lead, _cdiv(rows, bm), _cdiv(cols, bn)]
    if list(scales.shape) != want:
        raise ValueError(f"fp8 scales {list(scales.shape)} do not match values "
                         f"{list(values.shape)} with block_size ({bm}, {bn}): expected {want}")
    s = scales.repeat_interleave(bm, dim=-2)[..., :rows, :]
    s = s.repeat_interleave(bn, dim=-1)[..., :cols]
    return values.float() * s


def quantize_nvfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantise each matrix ``w [..., R, C]`` to NVFP4 in the NVIDIA ModelOpt checkpoint layout.

    ModelOpt ``NVFP4QTensor`` (``modelopt/torch/quantization/qtensor/nvfp4_tensor.py``, dynamic
    path), in fp32: the per-tensor ``weight_scale_2`` ``g = amax / (6 * 448)`` over the whole
    ``[R, C]`` matrix (1 for an all-zero matrix, where ModelOpt would divide by 0); per group
    of 16 columns ``s = e4m3(clamp(group_amax / (6 * g), 2^-9, 448))`` (a zero ratio becomes 1
    first); codes ``e2m1(w / (s * g))`` rounded to nearest, ties to the even code, saturating at
    6, with the sign bit set for every negative input (ModelOpt's ``_cast_fp4``), packed two per
    byte, low nibble = even column (``(q[..., 1::2] << 4) | q[..., 0::2]``).

    Returns:
        ``(packed [..., R, C/2] uint8, scales [..., R, C/16] float8_e4m3fn, global [..., R]
        float32)``: ``global`` repeats the matrix's ``g`` on each of its rows (the banks keep one
        per row, so fused gate / up rows keep their own), contiguous, CPU.

    Raises:
        TypeError: ``w`` is not a floating-point tensor.
        ValueError: ``w`` has fewer than 2 dims, C is not a multiple of 16, or a NaN/inf.
    """
    w = _check_weight(w, "nvfp4", NVFP4_GROUP).float()
    if w.dim() < 2:
        raise ValueError(f"nvfp4: w must be [..., R, C], got shape {list(w.shape)}")
    amax = w.abs().amax(dim=(-2, -1))  # [...]
    g = torch.where(amax > 0, amax / (6.0 * FP8_MAX), torch.ones_like(amax))
    grp = w.reshape(*w.shape[:-1], w.shape[-1] // NVFP4_GROUP, NVFP4_GROUP)  # [..., R, C/16, 16]
    ratio = grp.abs().amax(-1) / (6.0 * g[..., None, None])
    ratio = torch.where(ratio == 0, torch.ones_like(ratio), ratio)
    scales = ratio.clamp(min=2.0**-9, max=FP8_MAX).to(torch.float8_e4m3fn)
    v = grp / (scales.float() * g[..., None, None])[..., None]
    codes = _e2m1_index(v.abs()) | torch.where(v < 0, 8, 0)
    packed = _pack_nibbles(codes.flatten(-2))
    glob = g[..., None].expand(w.shape[:-1]).contiguous()
    return packed.contiguous(), scales.contiguous(), glob


def dequantize_nvfp4(
    packed: torch.Tensor, scales: torch.Tensor, global_scales: torch.Tensor
) -> torch.Tensor:
    """NVFP4 ``packed [..., R, C/2]`` (uint8), ``scales [..., R, C/16]`` (float8_e4m3fn) and
    ``global_scales [..., R]`` (float32) -> fp32 ``[..., R, C]``.

    ``w = e2m1(code) * fp32(e4m3(s) * g)``: the formula of ModelOpt's
    ``NVFP4QTensor.dequantize`` and vLLM's ``dequantize_to_dtype`` (unswizzled scales) in fp32,
    bit for bit (the block scale times the global first, then times the code). The kernel
    multiplies the exact ``e2m1 * e4m3`` and applies ``g`` to each row's sum, so the two
    differ by at most a rounding of each weight (2^-23 relative).

    Raises:
        TypeError: wrong dtypes.
        ValueError: shapes disagree.
    """
    if (packed.dtype != torch.uint8 or scales.dtype != torch.float8_e4m3fn
            or global_scales.dtype != torch.float32):
        raise TypeError(f"nvfp4 packed, scales and global must be uint8, float8_e4m3fn and "
                        f"float32, got {packed.dtype}, {scales.dtype} and {global_scales.dtype}")
    if (packed.dim() < 2 or scales.shape[:-1] != packed.shape[:-1]
            or 2 * packed.shape[-1] != NVFP4_GROUP * scales.shape[-1]
            or global_scales.shape != packed.shape[:-1]):
        raise ValueError(f"nvfp4 packed {list(packed.shape)}, scales {list(scales.shape)} and "
                         f"global {list(global_scales.shape)} must be [..., R, C/2], "
                         f"[..., R, C/16] and [..., R]")
    lut = torch.tensor(FP4_MAGNITUDES + tuple(-m for m in FP4_MAGNITUDES), dtype=torch.float32)
    vals = lut[_unpack_nibbles(packed)]  # [..., R, C]
    block = scales.float() * global_scales[..., None]  # [..., R, C/16]
    out = vals.reshape(*block.shape, NVFP4_GROUP) * block[..., None]
    return out.flatten(-2)
