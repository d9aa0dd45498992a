"""``make-tiny``: seeded-random checkpoints in exactly the Hugging Face layout.

A generated directory holds ``config.json`` (every key of the real config, see
``tiny_presets``), the weights (``model.safetensors``, or shards + index for ``small``),
``generation_config.json`` (eos ids ``[<|im_end|>, <|endoftext|>]`` for the Qwen families,
``[<|endoftext|>, <|user|>, <|observation|>]`` for GLM), the project's trained 8k BPE
``tokenizer.json`` with the family's added tokens (``tiny_tokens``) and ``tokenizer_config.json``
with the chat template of ``templates/<arch>.jinja``.

End of turn: with random weights the end-of-turn token (``<|im_end|>``; GLM ``<|user|>``) is
almost never sampled, so agent clients would always run to the token cap. After writing the
weights, the lm_head row of that token is multiplied by a factor calibrated on the model's own states (``tiny_calibrate``: mean
end-of-turn probability 1/16 per step at temperature 1, so a turn ends after roughly 5-30
tokens; tests/models/test_end_of_turn.py measures it). The factor is recorded in
``freetoken_tiny.json`` next to the weights (``config.json`` keeps only real keys). Nothing else
departs from the seeded random init.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from freetoken.models import tiny_mxfp4, tiny_nvfp4
from freetoken.models.config import ModelConfig
from freetoken.models.tiny_calibrate import TARGET_END_PROB, calibrate_im_end
from freetoken.models.tiny_fp8 import quantization_config
from freetoken.models.tiny_cache import (  # noqa: F401 - GENERATOR_VERSION re-exported
    GENERATOR_VERSION,
    STAMP_FILE,
    cache_path,
    chat_template,
    matches,
    stamp,
)
from freetoken.models.tiny_presets import preset_config
from freetoken.models.tiny_tokens import (
    TOKENIZER_FILE, end_of_turn, family_tokenizer, stop_tokens, token_id, tokenizer_config,
    tokenizer_size,
)
from freetoken.models.tiny_weights import write_safetensors

FP8_BLOCK = (128, 128)
VISION_TOKENS = {"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>",
                 "vision_start_token_id": "<|vision_start|>",
                 "vision_end_token_id": "<|vision_end|>"}


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def make_tiny(arch: str, preset: str, out_dir: str | Path, seed: int = 0,
              config_overrides: dict | None = None, weights: str = "bf16",
              expert_format: str | None = None) -> Path:
    """Write a seeded-random ``arch`` checkpoint of size ``preset`` into ``out_dir``.

    Args:
        arch: ``"qwen3_moe"``, ``"qwen3_next"`` or ``"qwen3_5_moe"``.
        preset: ``"tiny"`` (~22 MB, for tests) or ``"small"`` (~1.3 GB, 1.21 GB of routed
            experts, for benchmarks; written in 256 MB shards so peak RAM stays low).
        out_dir: created if missing; existing files of the same names are overwritten.
        seed: the same seed gives byte-identical files on a given machine (the ``<|im_end|>``
            factor comes from sampling the model, on a 0.25 grid, so last-bit float differences
            between machines almost never change it).
        config_overrides: keys replaced in ``config.json`` before the weights are derived
            from it (tests use it for variants such as dense ``mlp_only_layers``).
        weights: ``"bf16"``, or ``"fp8"``: projection weights FP8 block-quantised with
            128 x 128 blocks and a ``quantization_config``, as the official -FP8 releases;
            ``"nvfp4"``: projection weights in NVIDIA ModelOpt's NVFP4 export layout.
        expert_format: gpt_oss only: ``"mxfp4"`` (the default, as released) or ``"bf16"``
            (the dequantised layout).

    Returns:
        ``out_dir`` as a Path; ``freetoken_tiny.json`` there records the inputs and the chosen
        ``im_end_row_scale``.

    Raises:
        ValueError: unknown arch / preset, or overrides that make an invalid config or tie
            the embeddings.
        FileNotFoundError: ``templates/<arch>.jinja`` does not exist.
    """
    out = Path(out_dir)
    tokenizer = family_tokenizer(arch)
    bos, eos = token_id(tokenizer, "<|endoftext|>"), token_id(tokenizer, end_of_turn(arch))
    stops = [token_id(tokenizer, t) for t in stop_tokens(arch)]
    vocab = -(-tokenizer_size(tokenizer) // 64) * 64
    vision_ids = ({key: token_id(tokenizer, token) for key, token in VISION_TOKENS.items()}
                  if arch == "qwen3_5_moe" else None)
    raw = preset_config(arch, preset, vocab, bos, eos, vision_ids, stops)
    # a multimodal config takes the overrides in its text_config (where the text model lives)
    (raw["text_config"] if "text_config" in raw else raw).update(config_overrides or {})
    config = ModelConfig.from_hf(raw)
    if config.tie_word_embeddings:
        raise ValueError("make_tiny: tie_word_embeddings is unsupported (the <|im_end|> row of "
                         "lm_head is calibrated separately from the embedding)")
    template = chat_template(arch)
    out.mkdir(parents=True, exist_ok=True)
    if weights not in ("bf16", "fp8", "nvfp4"):
        raise ValueError(f"make_tiny: weights must be 'bf16', 'fp8' or 'nvfp4', got {weights!r}")
    block = FP8_BLOCK if weights == "fp8" else None
    if expert_format is not None and arch != "gpt_oss":
        raise ValueError("make_tiny: expert_format applies to gpt_oss only")
    mxfp4 = arch == "gpt_oss" and (expert_format or "mxfp4") == "mxfp4"
    if arch == "gpt_oss" and (weights != "bf16" or expert_format not in (None, "mxfp4",
                                                                         "bf16")):
        raise ValueError("make_tiny: gpt_oss experts are 'mxfp4' (default) or 'bf16', and its "
                         "other weights stay bf16")
    files = write_safetensors(config, seed, out, vision_config=raw.get("vision_config"),
                              fp8_block=block, mxfp4=mxfp4, nvfp4=weights == "nvfp4")
    if block is not None:
        raw["quantization_config"] = quantization_config(block, _not_converted(files))
    if weights == "nvfp4":
        ignored = _not_converted(files)
        raw["quantization_config"] = tiny_nvfp4.quantization_config(ignored)
        _write_json(out / "hf_quant_config.json", tiny_nvfp4.hf_quant_config(ignored))
    if mxfp4:
        raw["quantization_config"] = tiny_mxfp4.quantization_config()
    _write_json(out / "config.json", raw)
    _write_json(out / "generation_config.json", {
        "bos_token_id": bos,
        "eos_token_id": stops,
        "pad_token_id": bos,
        "transformers_version": raw["transformers_version"],
    })
    if arch in ("glm4_moe", "gpt_oss"):
        _write_json(out / "tokenizer.json", tokenizer)
    else:
        shutil.copyfile(TOKENIZER_FILE, out / "tokenizer.json")
    _write_json(out / "tokenizer_config.json",
                tokenizer_config(arch, tokenizer, template, config.max_position_embeddings))
    dtype = torch.bfloat16 if preset == "small" else torch.float32
    scale = calibrate_im_end(out, eos, dtype, seed)
    made_from = stamp(arch, preset, seed, config_overrides)
    made_from.update(im_end_row_scale=scale, im_end_target_prob=TARGET_END_PROB)
    _write_json(out / STAMP_FILE, made_from)
    return out


def _not_converted(files: list[Path]) -> list[str]:
    """Modules of the written files whose weights stay unquantised (``modules_to_not_convert``:
    every ``.weight`` of two or more dims that has no ``_scale_inv`` / NVFP4 ``_scale``)."""
    from safetensors import safe_open

    names: dict[str, int] = {}
    for file in files:
        if file.suffix == ".safetensors":
            with safe_open(file, framework="pt") as f:
                names.update({n: len(f.get_slice(n).get_shape()) for n in f.keys()})
    return sorted(n[: -len(".weight")] for n, dims in names.items()
                  if n.endswith(".weight") and dims >= 2 and n + "_scale_inv" not in names
                  and n + "_scale" not in names)


def cached_tiny(arch: str, preset: str = "tiny", seed: int = 0,
                progress: Callable[[str], None] | None = None) -> Path:
    """A checkpoint under ``cache_dir()/models/<preset>-<arch>``, generated on first use.

    Generated into a temporary sibling directory and renamed into place, so a directory that
    exists is complete; reused while its stamp (arch, preset, seed, generator version, hash of
    tokenizer + template) matches, regenerated otherwise.

    Raises:
        FileNotFoundError: the chat template is missing (see :func:`make_tiny`).
    """
    final = cache_path(arch, preset)
    root = final.parent
    expected = stamp(arch, preset, seed)
    if matches(final, expected):
        return final
    if progress:
        progress(f"generating {preset} {arch} checkpoint in {final}")
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
    try:
        make_tiny(arch, preset, tmp, seed=seed)
        tmp.chmod(0o755)  # mkdtemp makes it 0700
        if final.exists():
            stale = root / f".stale-{final.name}-{os.getpid()}"
            os.rename(final, stale)
            shutil.rmtree(stale, ignore_errors=True)
        os.rename(tmp, final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if matches(final, expected):
            return final  # another process finished first
        raise
    finally:
        if tmp.exists() and tmp != final:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def default_model_path(progress: Callable[[str], None] | None = None) -> Path:
    """The embedded tiny qwen3_next checkpoint (``cache_dir()/models/tiny-qwen3_next``).

    Args:
        progress: optional callback receiving a one-line message when it has to be generated.
    """
    return cached_tiny("qwen3_next", "tiny", 0, progress)
