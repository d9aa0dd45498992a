"""gpt-oss's released tensor layout for generated checkpoints: fused experts, MXFP4 by default.

The model names each expert's tensors apart (``mlp.experts.{e}.gate_up_proj [2I, H]`` with
interleaved gate / up rows, ``down_proj [H, I]``, their ``_bias`` rows: ``loader.Checkpoint``'s
canonical form); the releases fuse them per layer: bf16 ``experts.gate_up_proj [E, H, 2I]`` and
``experts.down_proj [E, I, H]`` (``[in, out]``, as transformers ``GptOssExperts``),
``experts.{gate_up,down}_proj_bias [E, out]``, and in the MXFP4 releases the weights as
``*_blocks [E, out, in/32, 16]`` + ``*_scales [E, out, in/32]`` (uint8, model-architectures.md
§4.2), quantised round-to-nearest by ``ops.cpu_moe.quant.quantize_mxfp4``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import torch

from freetoken.models.config import ModelConfig
from freetoken.ops.cpu_moe.quant import quantize_mxfp4

_EXPERT = re.compile(r"(.*\.mlp\.experts)\.(\d+)\.(gate_up_proj|down_proj)(_bias)?")
_FUSED_WEIGHT = re.compile(r".*\.mlp\.experts\.(gate_up_proj|down_proj)")
NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                 "lm_head"]


def released(spec, config: ModelConfig) -> list:
    """The stored form of one canonical tensor spec (fused, emitted at expert 0) in the bf16
    layout."""
    from freetoken.models.tiny_weights import TensorSpec

    expert = _EXPERT.fullmatch(spec.name)
    if expert is None:
        return [spec]
    base, index, proj, bias = expert.groups()
    if index != "0":
        return []
    e, h, i = config.num_experts, config.hidden_size, config.moe_intermediate_size
    out = 2 * i if proj == "gate_up_proj" else h
    shape = (e, out) if bias else (e, h, 2 * i) if proj == "gate_up_proj" else (e, i, h)
    return [TensorSpec(f"{base}.{proj}{bias or ''}", shape, spec.dtype)]


def _blocks_specs(spec) -> list:
    from freetoken.models.tiny_weights import TensorSpec

    e, cin, cout = spec.shape
    return [TensorSpec(spec.name + "_blocks", (e, cout, cin // 32, 16), torch.uint8),
            TensorSpec(spec.name + "_scales", (e, cout, cin // 32), torch.uint8)]


def mxfp4_specs(specs: Iterable) -> list:
    """``specs`` (bf16 layout) with every fused expert weight as its blocks and scales.

    Raises:
        ValueError: an expert input dim that is not a multiple of 32.
    """
    out = []
    for spec in specs:
        if not _FUSED_WEIGHT.fullmatch(spec.name):
            out.append(spec)
            continue
        if spec.shape[1] % 32:
            raise ValueError(f"{spec.name}: MXFP4 needs input dims that are multiples of 32, "
                             f"got {spec.shape[1]}")
        out.extend(_blocks_specs(spec))
    return out


def mxfp4_items(items: Iterable) -> Iterator:
    """The generated ``(spec, tensor)`` stream with fused expert weights replaced by their
    MXFP4 blocks and scales (same order as :func:`mxfp4_specs`)."""
    for spec, tensor in items:
        if not _FUSED_WEIGHT.fullmatch(spec.name):
            yield spec, tensor
            continue
        blocks, scales = quantize_mxfp4(tensor.float().transpose(1, 2).contiguous())
        block_spec, scale_spec = _blocks_specs(spec)
        yield block_spec, blocks.contiguous()
        yield scale_spec, scales.contiguous()


def quantization_config() -> dict:
    """The ``config.json`` ``quantization_config`` of the MXFP4 releases."""
    return {"modules_to_not_convert": list(NOT_CONVERTED), "quant_method": "mxfp4"}
