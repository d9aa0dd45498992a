"""Builds the right model family for a checkpoint directory and loads its weights.

Dispatch is on ``config.json``'s ``architectures[0]`` (as transformers' ``AutoModelForCausalLM``
does via the config class).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from freetoken.huge_pages import advise_huge_pages
from freetoken.models.base import CausalLM
from freetoken.models.config import ModelConfig, unsupported_architecture_error
from freetoken.models.decoder import DecoderLM
from freetoken.models.glm4_moe import Glm4MoeForCausalLM
from freetoken.models.gpt_oss import GptOssForCausalLM
from freetoken.models.host_memory import (
    available_host_memory, check_host_memory, host_bytes_needed, routed_expert_bytes,
)
from freetoken.models.load_progress import LoadProgress
from freetoken.models.loader import Checkpoint, load_weights
from freetoken.units import format_bytes
from freetoken.models.qwen3_5_moe import Qwen3_5MoeForCausalLM
from freetoken.models.qwen3_moe import Qwen3MoeForCausalLM
from freetoken.models.qwen3_next import Qwen3NextForCausalLM

MODEL_CLASSES: dict[str, type[DecoderLM]] = {
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "Qwen3NextForCausalLM": Qwen3NextForCausalLM,
    "Qwen3_5MoeForConditionalGeneration": Qwen3_5MoeForCausalLM,
    "Qwen3_5MoeForCausalLM": Qwen3_5MoeForCausalLM,
    "Glm4MoeForCausalLM": Glm4MoeForCausalLM,
    "GptOssForCausalLM": GptOssForCausalLM,
}
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)
logger = logging.getLogger("freetoken.models")


def load_model(path: str | Path, dtype: torch.dtype = torch.float32,
               device: str = "cpu", moe=None,
               bandwidths: tuple[float, float] | None = None,
               progress: LoadProgress | None = None, packed=None) -> CausalLM:
    """Load an HF checkpoint directory (``config.json`` + safetensors), or a packed one
    (``freetoken convert``), as a FreeToken model.

    Args:
        path: checkpoint directory.
        dtype: compute dtype, ``torch.float32`` (default) or ``torch.bfloat16``; weights are cast
            from their stored dtype.
        device: parameter device.
        moe: a ``freetoken.offload.backend.MoeConfig``; None (or a backend resolving to
            ``resident``) keeps every expert on the device as a parameter.
        bandwidths: profiled ``(B_P, B_H)`` in GB/s for the hybrid miss split.
        progress: receives a ``LoadStep`` after every tensor read (``load_progress``), or None.
        packed: ``path``'s :class:`~freetoken.packed.manifest.PackedManifest` when the caller
            read it already (None: read here when ``path`` is packed).

    Returns:
        the model in eval mode, parameters without grad.

    Raises:
        FileNotFoundError: no config.json / safetensors files.
        ValueError: unsupported architecture (lists the supported ones), bad config keys,
            unsupported dtype, missing / unexpected / mis-shaped tensors, or weights that do
            not fit in the available host memory (checked before any is read).
    """
    path = Path(path)
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"unsupported dtype {dtype}; supported: float32, bfloat16")
    file = path / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"no config.json in {path}")
    raw = json.loads(file.read_text(encoding="utf-8"))
    archs = raw.get("architectures") if isinstance(raw, dict) else None
    arch = archs[0] if isinstance(archs, list) and archs else None
    if arch not in MODEL_CLASSES:
        raise unsupported_architecture_error(arch)
    config = ModelConfig.from_hf(with_modelopt_config(path, raw))
    checkpoint = Checkpoint.for_config(path, config, packed=packed)
    vision = sum(name.startswith("model.visual.") for name in checkpoint.ignored)
    if vision:
        logger.info("vision tower not loaded (%d tensors): serving the text model only", vision)
    _check_memory(MODEL_CLASSES[arch], config, checkpoint, dtype, torch.device(device), moe)
    if config.quant_method is not None:
        logger.info("%s checkpoint: dense weights dequantised to %s as they are read (experts "
                    "in host banks, and resident ones on a CPU device, stay as stored)",
                    config.quant_method, str(dtype).removeprefix("torch."))
    if moe is not None:
        from freetoken.offload.loading import build_offloaded

        model = build_offloaded(MODEL_CLASSES[arch], config, checkpoint, dtype, device, moe,
                                bandwidths, progress)
        if model is not None:
            return model.eval()
    from freetoken.offload.resident import build_resident_banks, resident_plan

    plan = resident_plan(config, checkpoint, torch.device(device), moe)
    if plan is not None:
        return build_resident_banks(MODEL_CLASSES[arch], config, checkpoint, dtype, *plan, moe,
                                    progress).eval()
    model = MODEL_CLASSES[arch](config, dtype=dtype, device=device)
    advise_huge_pages(model.parameters())  # before load_weights first writes them
    if checkpoint.packed is None:
        load_weights(checkpoint, model.weight_targets(), progress)
    else:
        from freetoken.packed.load import load_checkpoint

        load_checkpoint(checkpoint, model.weight_targets(), progress)
    return model.eval()


def with_modelopt_config(path: Path, raw: dict) -> dict:
    """``raw`` with the ``quantization_config`` an older ModelOpt export keeps only in
    ``hf_quant_config.json`` (``{"quantization": {"quant_algo": ...}}``)."""
    file = path / "hf_quant_config.json"
    if "quantization_config" in raw or not file.is_file():
        return raw
    try:
        quant = json.loads(file.read_text(encoding="utf-8")).get("quantization")
    except (json.JSONDecodeError, AttributeError) as exc:
        raise ValueError(f"{file}: not a ModelOpt quantisation config ({exc})") from None
    if not isinstance(quant, dict):
        raise ValueError(f"{file}: no 'quantization' object")
    return {**raw, "quantization_config": {"quant_method": "modelopt", **quant}}


def _check_memory(model_cls: type[DecoderLM], config: ModelConfig, checkpoint: Checkpoint,
                  dtype: torch.dtype, device: torch.device, moe) -> None:
    """Refuse a load whose weights exceed ``MemAvailable`` (see ``host_memory``)."""
    from freetoken.offload.backend import resolve_backend
    from freetoken.offload.loading import (
        bank_dtype, first_expert_tensor, model_bytes, stored_expert_format,
    )
    from freetoken.offload.resident import resident_plan

    total = model_bytes(model_cls, config, dtype)
    experts = routed_expert_bytes(config, dtype.itemsize)
    banks, bank_type = None, dtype
    resident = moe is None or resolve_backend(moe.backend, device, total) == "resident"
    # host banks: offloaded experts, or resident ones kept in a kernel format on the CPU
    if experts and (not resident or resident_plan(config, checkpoint, device, moe) is not None):
        bank_type = bank_dtype(checkpoint, dtype, first_expert_tensor(config))
        banks = routed_expert_bytes(config, bank_type.itemsize)
        stored = stored_expert_format(checkpoint, config)
        if stored is not None:  # value + scale bytes per 32 values
            banks = routed_expert_bytes(config, {"mxfp4": 17, "nvfp4": 18, "fp8": 32}[stored])
            banks, bank_type = banks // 32, stored
    needed = host_bytes_needed(total, experts, banks, device)
    expert_part = experts if banks is None else banks
    name = str(bank_type).removeprefix("torch.")
    detail = f"routed experts {format_bytes(expert_part)} in {name}"
    if device.type == "cpu":
        detail += f", other weights {format_bytes(total - experts)}"
    check_host_memory(needed, available_host_memory(), checkpoint.path, detail)
