"""gpt-oss keys of ``config.json`` (transformers ``GptOssConfig``, model-architectures.md §4.1).

Sliding-window and full attention layers (``layer_types``, default alternating from a sliding
layer 0), attention sinks, q/k/v/o biases, YaRN RoPE from ``rope_parameters`` (v5) or
``rope_scaling`` (v4, the released files), the clamped expert activation and a biased router.
The released experts are MXFP4 (``quantization_config.quant_method == "mxfp4"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

_LAYER_TYPES = ("sliding_attention", "full_attention")
DEFAULT_YARN = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 4096}


@dataclass(frozen=True)
class YarnRope:
    """YaRN RoPE scaling (Peng et al. 2023, "YaRN"; transformers ``_compute_yarn_parameters``).

    Attributes:
        factor: context extension factor s.
        beta_fast, beta_slow: rotation counts bounding the interpolation ramp.
        original_max_positions: the pre-training context L0.
        truncate: round the ramp bounds to whole dims.
        attention_factor: multiplies cos and sin (``0.1 ln s + 1`` unless the file sets it).
    """

    factor: float
    beta_fast: float
    beta_slow: float
    original_max_positions: int
    truncate: bool
    attention_factor: float


def _yarn(params: dict) -> YarnRope:
    """A validated :class:`YarnRope` from a rope parameter dict."""
    def number(key: str, default: float | None = None) -> float:
        value = params.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"config.json: yarn {key!r} must be a positive number, got {value!r}")
        return float(value)

    factor = number("factor")
    original = params.get("original_max_position_embeddings")
    if isinstance(original, bool) or not isinstance(original, int) or original < 1:
        raise ValueError("config.json: yarn 'original_max_position_embeddings' must be a positive "
                         f"integer, got {original!r}")
    if params.get("mscale") or params.get("mscale_all_dim"):
        raise ValueError("config.json: yarn 'mscale' / 'mscale_all_dim' are unsupported")
    truncate = params.get("truncate", True)
    if not isinstance(truncate, bool):
        raise ValueError(f"config.json: yarn 'truncate' must be true or false, got {truncate!r}")
    default_factor = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return YarnRope(factor, number("beta_fast", 32.0), number("beta_slow", 1.0), original,
                    truncate, number("attention_factor", default_factor))


def _rope(config: dict) -> tuple[float, YarnRope | None]:
    """(rope_theta, yarn or None) from ``rope_parameters`` or ``rope_scaling`` + ``rope_theta``."""
    params = config.get("rope_parameters")
    if params is None:
        scaling = config.get("rope_scaling")
        params = dict(DEFAULT_YARN if scaling is None and "rope_scaling" not in config
                      else scaling or {"rope_type": "default"})
        params.setdefault("rope_theta", config.get("rope_theta", 150000.0))
    if not isinstance(params, dict):
        raise ValueError(f"config.json: rope parameters must be an object, got {params!r}")
    theta = params.get("rope_theta", config.get("rope_theta", 150000.0))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
        raise ValueError(f"config.json: missing or invalid 'rope_theta' ({theta!r})")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("yarn", "default"):
        raise ValueError(f"config.json: rope_type {kind!r} is unsupported for gpt_oss "
                         "(served: yarn, default)")
    return float(theta), _yarn(params) if kind == "yarn" else None


def gpt_oss_fields(config: dict, r, layers: int) -> dict:
    """The ``ModelConfig`` fields only gpt-oss sets, plus ``rope_theta`` and ``layer_types``
    (popped by the caller). ``r`` is the config's ``_Reader``.

    Raises:
        ValueError: a bad ``layer_types`` list, sliding window, rope or swiglu key.
    """
    types = config.get("layer_types")
    if types is None:
        types = [_LAYER_TYPES[i % 2] for i in range(layers)]
    if (not isinstance(types, list) or len(types) != layers
            or any(t not in _LAYER_TYPES for t in types)):
        raise ValueError(f"config.json: 'layer_types' must be a list of {layers} entries from "
                         f"{', '.join(_LAYER_TYPES)}")
    window = r.int("sliding_window", 128) if "sliding_attention" in types else 0
    theta, yarn = _rope(config)
    bias = r.bool("attention_bias", True)
    return {
        "rope_theta": theta,
        "layer_types": tuple(types),
        "sliding_window": window,
        "attention_sinks": True,
        "o_proj_bias": bias,
        "yarn": yarn,
        "swiglu_limit": r.float("swiglu_limit", 7.0),
        "swiglu_alpha": r.float("swiglu_alpha", 1.702),
        "expert_bias": True,
        "router_bias": True,
        "router_scoring": "topk_softmax",
    }
