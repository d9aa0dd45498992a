"""Seeded random weights for generated checkpoints, written shard by shard with ``safetensors``.

Tensor names and shapes come from the FreeToken model built on the ``meta`` device (its
``weight_targets``: the real HF names, per-expert ``mlp.experts.E.{gate,up,down}_proj.weight``),
rewritten for Qwen3.5 into its released layout (``model.language_model.`` prefix, fused
``experts.gate_up_proj [E, 2I, H]`` / ``experts.down_proj [E, H, I]``, float32 ``A_log`` and
``linear_attn.norm.weight``, a ``model.visual.*`` tower from ``vision_config``), and transformers
loads the result independently in the parity tests. Initialisation follows
model-architectures.md §9: linear and router weights N(0, 0.02); token embeddings N(0, 1) (with
0.02 the residual stream of a random Qwen3-MoE is dominated by context-averaged attention output,
so its logits barely depend on the current token and end-of-turn calibration becomes
prompt-dependent; with N(0, 1) both families behave alike); zero-centred norms
(Qwen3-Next) N(0, 0.02) around 0, plain norms (Qwen3-MoE, the GDN gated norm) 1 + N(0, 0.02);
``A_log = log(U(1, 16))``; ``dt_bias = 1``; conv taps U(-1/sqrt(K), 1/sqrt(K)) (torch's Conv1d
default). Everything is stored bfloat16 except ``A_log`` and GLM's ``e_score_correction_bias``
(float32, as released).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from freetoken.models.config import ModelConfig
from freetoken.models.loader import INDEX_FILE, SINGLE_FILE, TEXT_PREFIX

INIT_STD = 0.02
EMBED_STD = 1.0
STORED_DTYPE = torch.bfloat16
MAX_SHARD_BYTES = 256 * 2**20
_EXPERT = re.compile(r"(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight")


@dataclass(frozen=True)
class TensorSpec:
    """One tensor to generate: HF name, shape, stored dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        """Stored size in bytes."""
        n = 1
        for d in self.shape:
            n *= d
        return n * torch.empty(0, dtype=self.dtype).element_size()


def tensor_specs(config: ModelConfig, vision_config: dict | None = None,
                 fused_experts: bool = True) -> list[TensorSpec]:
    """All checkpoint tensors of ``config`` in generation order (embedding, lm_head, final norm,
    then layer by layer, as the model's ``weight_targets`` lists them; then the vision tower of
    ``vision_config`` if given), named as the family releases them (Qwen3.5's -FP8 releases keep
    per-expert tensors: ``fused_experts`` False)."""
    from freetoken.models.registry import MODEL_CLASSES

    from freetoken.models import tiny_mxfp4

    model = MODEL_CLASSES[config.arch](config, dtype=STORED_DTYPE, device="meta")
    qwen3_5, oss = config.model_type == "qwen3_5_moe", config.model_type == "gpt_oss"
    specs = []
    for name, target in model.weight_targets().items():
        fp32 = (name.endswith(("A_log", "e_score_correction_bias"))
                or (qwen3_5 and name.endswith("linear_attn.norm.weight")))
        spec = TensorSpec(name, tuple(target.dest.shape), torch.float32 if fp32 else STORED_DTYPE)
        if qwen3_5:
            specs.extend(_released(spec, config, fused_experts))
        else:
            specs.extend(tiny_mxfp4.released(spec, config) if oss else [spec])
    return specs + (_vision_specs(vision_config) if vision_config else [])


def _released(spec: TensorSpec, config: ModelConfig, fused: bool) -> list[TensorSpec]:
    """Qwen3.5's stored form of one canonical tensor: prefixed, experts fused when ``fused``
    (emitted once, at expert 0's gate and down tensors)."""
    name = spec.name if spec.name == "lm_head.weight" else TEXT_PREFIX + spec.name[len("model."):]
    expert = _EXPERT.fullmatch(name)
    if expert is None or not fused:
        return [TensorSpec(name, spec.shape, spec.dtype)]
    base, index, proj = expert.groups()
    if index != "0" or proj == "up":
        return []
    e, i, h = config.num_experts, config.moe_intermediate_size, config.hidden_size
    if proj == "gate":
        return [TensorSpec(base + ".gate_up_proj", (e, 2 * i, h), spec.dtype)]
    return [TensorSpec(base + ".down_proj", (e, h, i), spec.dtype)]


def _vision_specs(vision: dict) -> list[TensorSpec]:
    """``model.visual.*`` of a Qwen3.5 vision tower (patch embed, blocks, merger), from its
    config; written so the file has the released layout, never loaded by the engine."""
    d, mlp, out = vision["hidden_size"], vision["intermediate_size"], vision["out_hidden_size"]
    patch, merged = vision["patch_size"], d * vision["spatial_merge_size"] ** 2
    shapes = {
        "patch_embed.proj.weight": (d, vision["in_channels"], vision["temporal_patch_size"],
                                    patch, patch),
        "patch_embed.proj.bias": (d,),
        "pos_embed.weight": (vision["num_position_embeddings"], d),
    }
    for b in range(vision["depth"]):
        for part, shape in (("norm1.weight", (d,)), ("norm1.bias", (d,)), ("norm2.weight", (d,)),
                            ("norm2.bias", (d,)), ("attn.qkv.weight", (3 * d, d)),
                            ("attn.qkv.bias", (3 * d,)), ("attn.proj.weight", (d, d)),
                            ("attn.proj.bias", (d,)), ("mlp.linear_fc1.weight", (mlp, d)),
                            ("mlp.linear_fc1.bias", (mlp,)), ("mlp.linear_fc2.weight", (d, mlp)),
                            ("mlp.linear_fc2.bias", (d,))):
            shapes[f"blocks.{b}.{part}"] = shape
    shapes.update({
        "merger.norm.weight": (d,), "merger.norm.bias": (d,),
        "merger.linear_fc1.weight": (merged, merged), "merger.linear_fc1.bias": (merged,),
        "merger.linear_fc2.weight": (out, merged), "merger.linear_fc2.bias": (out,),
    })
    return [TensorSpec("model.visual." + n, s, STORED_DTYPE) for n, s in shapes.items()]


def _init(spec: TensorSpec, config: ModelConfig, gen: torch.Generator) -> torch.Tensor:
    name, shape = spec.name, spec.shape
    if name.endswith("A_log"):
        return torch.empty(shape).uniform_(1.0, 16.0, generator=gen).log_()
    if name.endswith("dt_bias"):
        return torch.ones(shape)
    if name.endswith("conv1d.weight"):
        bound = shape[-1] ** -0.5
        return torch.empty(shape).uniform_(-bound, bound, generator=gen)
    embed = name in ("model.embed_tokens.weight", TEXT_PREFIX + "embed_tokens.weight")
    std = EMBED_STD if embed else INIT_STD
    noise = torch.randn(shape, generator=gen) * std
    if name.endswith("norm.weight"):
        zero_centered = config.zero_centered_norms and not name.endswith("linear_attn.norm.weight")
        return noise if zero_centered else noise + 1.0
    return noise


def generate(config: ModelConfig, seed: int, vision_config: dict | None = None,
             fused_experts: bool = True) -> Iterator[tuple[TensorSpec, torch.Tensor]]:
    """Yield ``(spec, tensor)`` one at a time, deterministically for ``seed``.

    Args:
        config: the checkpoint's config.
        seed: seeds one ``torch.Generator`` consumed in tensor order.
        vision_config: a Qwen3.5 ``vision_config`` whose tower is written too, or None.
    """
    gen = torch.Generator().manual_seed(seed)
    for spec in tensor_specs(config, vision_config, fused_experts):
        yield spec, _init(spec, config, gen).to(spec.dtype)


def write_safetensors(config: ModelConfig, seed: int, out_dir: Path,
                      max_shard_bytes: int = MAX_SHARD_BYTES,
                      vision_config: dict | None = None,
                      fp8_block: tuple[int, int] | None = None,
                      mxfp4: bool = False, nvfp4: bool = False) -> list[Path]:
    """Write the weights as ``model.safetensors`` or, above ``max_shard_bytes``, as shards
    ``model-0000i-of-0000n.safetensors`` plus ``model.safetensors.index.json``.

    Only one shard is held in memory at a time. ``fp8_block``: store the projection weights
    FP8 block-quantised (``tiny_fp8``) with that block shape. ``mxfp4``: store gpt-oss's
    fused expert weights as MXFP4 blocks and scales (``tiny_mxfp4``).

    Returns:
        the written files.
    """
    from freetoken.models import tiny_fp8, tiny_mxfp4, tiny_nvfp4

    fused = fp8_block is None and not nvfp4
    specs = tensor_specs(config, vision_config, fused)
    items = generate(config, seed, vision_config, fused)
    if fp8_block is not None:
        specs = tiny_fp8.quantized_specs(specs, fp8_block)
        items = tiny_fp8.quantized(items, fp8_block)
    if nvfp4:
        specs = tiny_nvfp4.quantized_specs(specs)
        items = tiny_nvfp4.quantized(items)
    if mxfp4:
        specs = tiny_mxfp4.mxfp4_specs(specs)
        items = tiny_mxfp4.mxfp4_items(items)
    shard_of, size, shard = [], 0, 0
    for spec in specs:
        if size and size + spec.nbytes > max_shard_bytes:
            shard, size = shard + 1, 0
        shard_of.append(shard)
        size += spec.nbytes
    count = shard + 1
    names = [SINGLE_FILE] if count == 1 else [
        f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)
    ]
    buffer: dict[str, torch.Tensor] = {}
    weight_map: dict[str, str] = {}
    written = []
    for i, (spec, tensor) in enumerate(items):
        buffer[spec.name] = tensor.contiguous()
        weight_map[spec.name] = names[shard_of[i]]
        if i + 1 == len(specs) or shard_of[i + 1] != shard_of[i]:
            path = out_dir / names[shard_of[i]]
            save_file(buffer, str(path), metadata={"format": "pt"})
            path.chmod(0o644)  # safetensors creates files 0600
            written.append(path)
            buffer = {}
    if count > 1:
        index = {"metadata": {"total_size": sum(s.nbytes for s in specs)}, "weight_map": weight_map}
        path = out_dir / INDEX_FILE
        path.write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
        written.append(path)
    return written
