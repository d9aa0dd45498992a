"""NVFP4 quantisation of generated checkpoints, in NVIDIA ModelOpt's exported layout.

Each projection weight (``tiny_fp8.quantizable``: attention, Gated DeltaNet, dense, shared and
per-expert projections) is stored as ``X.weight`` uint8 ``[R, C/2]`` (packed e2m1, low nibble =
even column), ``X.weight_scale`` float8_e4m3fn ``[R, C/16]``, ``X.weight_scale_2`` fp32 scalar
(the per-tensor global) and ``X.input_scale`` fp32 scalar (the activation scale ModelOpt
calibrates for 4-bit activations; 1 here, weight-only serving ignores it), quantised by
``ops.cpu_moe.quant.quantize_nvfp4`` (the ModelOpt recipe). Embeddings, lm_head, norms, routers
and gates stay bf16 (``ignore``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from freetoken.models.tiny_fp8 import quantizable
from freetoken.models.tiny_weights import TensorSpec
from freetoken.ops.cpu_moe.quant import quantize_nvfp4


def _parts(spec: TensorSpec) -> list[TensorSpec]:
    rows, cols = spec.shape
    return [TensorSpec(spec.name, (rows, cols // 2), torch.uint8),
            TensorSpec(spec.name + "_scale", (rows, cols // 16), torch.float8_e4m3fn),
            TensorSpec(spec.name + "_scale_2", (), torch.float32),
            TensorSpec(spec.name[: -len(".weight")] + ".input_scale", (), torch.float32)]


def _nvfp4(name: str) -> bool:
    return quantizable(name) and name.endswith(".weight")


def quantized_specs(specs: Iterable[TensorSpec]) -> list[TensorSpec]:
    """``specs`` with every 2-D projection weight as its four NVFP4 tensors.

    Raises:
        ValueError: a fused (3-D) expert tensor, or an input dim not a multiple of 16.
    """
    out = []
    for spec in specs:
        if not _nvfp4(spec.name):
            out.append(spec)
            continue
        if len(spec.shape) != 2 or spec.shape[1] % 16:
            raise ValueError(f"{spec.name} {list(spec.shape)}: NVFP4 needs 2-D weights with "
                             f"input dims that are multiples of 16")
        out.extend(_parts(spec))
    return out


def quantized(items: Iterable[tuple[TensorSpec, torch.Tensor]]
              ) -> Iterator[tuple[TensorSpec, torch.Tensor]]:
    """The generated ``(spec, tensor)`` stream with projection weights replaced by their NVFP4
    tensors (same order as :func:`quantized_specs`)."""
    for spec, tensor in items:
        if not _nvfp4(spec.name):
            yield spec, tensor
            continue
        packed, scales, global_ = quantize_nvfp4(tensor.float())
        values = (packed, scales, global_[0].clone(), torch.tensor(1.0))
        yield from zip(_parts(spec), values)


def quantization_config(ignored: list[str]) -> dict:
    """The ``config.json`` ``quantization_config`` of a ModelOpt NVFP4 export."""
    return {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
            "kv_cache_quant_algo": None, "ignore": ignored}


def hf_quant_config(ignored: list[str]) -> dict:
    """``hf_quant_config.json`` of a ModelOpt export (the same settings)."""
    return {"producer": {"name": "modelopt"},
            "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None,
                             "group_size": 16, "exclude_modules": ignored}}
