"""FP8 block quantisation of generated checkpoints, in the layout of the official -FP8 releases.

Each projection weight (``*_proj.weight``, the Gated DeltaNet ``in_proj_qkv`` / ``in_proj_z``,
per-expert or fused expert weights) is stored as float8 e4m3 values plus ``{name}_scale_inv``: one fp32 scale per ``block`` (rows,
cols) block, ``amax / 448`` of the block, so ``weight = values * scale`` (transformers
``FineGrainedFP8Config`` / ``Fp8Dequantize``). Embeddings, lm_head, norms, routers, the shared
expert gate, the Gated DeltaNet conv and ``in_proj_a`` / ``in_proj_b`` and the vision tower stay
bf16, as in the releases' ``modules_to_not_convert``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from freetoken.models.loader import SCALE_SUFFIX
from freetoken.models.tiny_weights import TensorSpec

FP8_MAX = 448.0  # largest finite float8 e4m3fn value
FP8 = torch.float8_e4m3fn


def quantizable(name: str) -> bool:
    """Whether tensor ``name`` is stored FP8 (a projection or fused expert weight)."""
    if name.startswith("model.visual."):
        return False
    return name.endswith(("_proj.weight", "experts.gate_up_proj", "experts.down_proj",
                          "in_proj_qkv.weight", "in_proj_z.weight", "in_proj_qkvz.weight"))


def quantized_specs(specs: Iterable[TensorSpec], block: tuple[int, int]) -> list[TensorSpec]:
    """``specs`` with every quantizable weight as FP8 followed by its fp32 scale grid.

    Raises:
        ValueError: a quantizable weight whose last two dims ``block`` does not divide.
    """
    out = []
    for spec in specs:
        if not quantizable(spec.name):
            out.append(spec)
            continue
        *lead, rows, cols = spec.shape
        if rows % block[0] or cols % block[1]:
            raise ValueError(f"{spec.name} {list(spec.shape)} is not divisible by the FP8 "
                             f"block {list(block)}")
        out.append(TensorSpec(spec.name, spec.shape, FP8))
        grid = (*lead, rows // block[0], cols // block[1])
        out.append(TensorSpec(spec.name + SCALE_SUFFIX, grid, torch.float32))
    return out


def quantize_blocks(weight: torch.Tensor, block: tuple[int, int]
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values [..., R, C] fp8, scales [..., R / bm, C / bn] fp32)`` of ``weight``."""
    *lead, rows, cols = weight.shape
    w = weight.float().reshape(*lead, rows // block[0], block[0], cols // block[1], block[1])
    amax = w.abs().amax(dim=(-3, -1))
    scales = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    values = (w / scales[..., :, None, :, None]).to(FP8).reshape(weight.shape)
    return values, scales


def quantized(items: Iterable[tuple[TensorSpec, torch.Tensor]], block: tuple[int, int]
              ) -> Iterator[tuple[TensorSpec, torch.Tensor]]:
    """The generated ``(spec, tensor)`` stream with quantizable weights replaced by their FP8
    values and scale grid (same order as :func:`quantized_specs`)."""
    for spec, tensor in items:
        if not quantizable(spec.name):
            yield spec, tensor
            continue
        values, scales = quantize_blocks(tensor, block)
        yield TensorSpec(spec.name, spec.shape, FP8), values
        yield TensorSpec(spec.name + SCALE_SUFFIX, tuple(scales.shape), torch.float32), scales


def quantization_config(block: tuple[int, int], not_converted: list[str]) -> dict:
    """The ``config.json`` ``quantization_config`` of an FP8 checkpoint."""
    return {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
            "weight_block_size": list(block), "modules_to_not_convert": not_converted}
