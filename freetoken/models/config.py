"""The engine's flat, validated view of a Hugging Face ``config.json``.

Follows the key tables of model-architectures.md §1.2 (Qwen3-Next), §1.3 (Qwen3.5-MoE), §3
(Qwen3-MoE), §5.6 (GLM-4.5) and §4 (gpt-oss) and the transformers config classes
``Qwen3NextConfig`` / ``Qwen3_5MoeTextConfig`` / ``Qwen3MoeConfig`` / ``Glm4MoeConfig`` /
``GptOssConfig`` (v5): the same defaults are used where a key may legitimately be absent
(``head_dim``, ``attention_bias``, ``mlp_only_layers``, ...), every key that shapes the network is
required. A multimodal release (Qwen3.5) is read from its ``text_config``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from freetoken.models.config_gpt_oss import YarnRope, gpt_oss_fields

# architectures[0] -> model_type the engine implements.
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Qwen3NextForCausalLM": "qwen3_next",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe",
    "Qwen3_5MoeForCausalLM": "qwen3_5_moe_text",
    "Glm4MoeForCausalLM": "glm4_moe",
    "GptOssForCausalLM": "gpt_oss",
}
# config.json model_type -> the engine family (chat template, model class).
FAMILY_OF_MODEL_TYPE = {"qwen3_5_moe_text": "qwen3_5_moe"}
HYBRID_FAMILIES = ("qwen3_next", "qwen3_5_moe")
_LEGACY_LAYER_TYPES = {"attention": "full_attention", "mamba": "linear_attention"}
_GDN_KEYS = (
    "linear_conv_kernel_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
)


def unsupported_architecture_error(arch: object) -> ValueError:
    """The ValueError raised for an architecture FreeToken cannot run (lists the supported ones)."""
    supported = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
    return ValueError(f"unsupported architecture {arch!r}; supported: {supported}")


class _Reader:
    """Typed access to a config dict; every error names the offending key."""

    def __init__(self, raw: dict) -> None:
        self.raw = raw

    def has(self, key: str) -> bool:
        return key in self.raw and self.raw[key] is not None

    def int(self, key: str, default: int | None = None, minimum: int = 1) -> int:
        if not self.has(key):
            if default is None:
                raise ValueError(f"config.json: missing required key {key!r}")
            return default
        value = self.raw[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"config.json: {key!r} must be an integer, got {value!r}")
        if value < minimum:
            raise ValueError(f"config.json: {key!r} must be >= {minimum}, got {value}")
        return value

    def float(self, key: str, default: float | None = None) -> float:
        if not self.has(key):
            if default is None:
                raise ValueError(f"config.json: missing required key {key!r}")
            return default
        value = self.raw[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"config.json: {key!r} must be a positive number, got {value!r}")
        return float(value)

    def bool(self, key: str, default: bool | None = None) -> bool:
        if not self.has(key):
            if default is None:
                raise ValueError(f"config.json: missing required key {key!r}")
            return default
        value = self.raw[key]
        if not isinstance(value, bool):
            raise ValueError(f"config.json: {key!r} must be true or false, got {value!r}")
        return value


@dataclass(frozen=True)
class ModelConfig:
    """Flat engine view of a Qwen3-MoE / Qwen3-Next / Qwen3.5-MoE / GLM-4.5 / gpt-oss HF config.

    Attributes:
        arch: ``architectures[0]`` (e.g. ``"Qwen3NextForCausalLM"``).
        model_type: the family: ``"qwen3_moe"``, ``"qwen3_next"``, ``"qwen3_5_moe"`` (also for
            a text-only ``qwen3_5_moe_text`` config), ``"glm4_moe"`` or ``"gpt_oss"``.
        vocab_size: embedding / lm_head rows V (may exceed the tokenizer size).
        hidden_size: H.
        num_hidden_layers: L.
        layer_types: per layer ``"full_attention"`` or ``"linear_attention"`` (Gated DeltaNet).
        num_attention_heads, num_key_value_heads, head_dim: attention heads (GQA) and head width.
        partial_rotary_factor: fraction of ``head_dim`` rotated by RoPE (1.0 for qwen3_moe).
        rope_theta: RoPE base.
        linear_conv_kernel_dim: GDN short causal conv width K (0 without GDN layers).
        linear_num_key_heads, linear_num_value_heads: GDN Hk and Hv (Hv % Hk == 0).
        linear_key_head_dim, linear_value_head_dim: GDN dk, dv.
        num_experts, num_experts_per_tok: routed experts E per MoE layer and top-k.
        norm_topk_prob: renormalise the top-k router probabilities to sum to 1.
        moe_intermediate_size: routed expert width I.
        shared_expert_intermediate_size: shared expert width (0: no shared expert).
        intermediate_size: dense MLP width (layers that are not MoE), 0 if there are none.
        decoder_sparse_step, mlp_only_layers: which layers are MoE (see :meth:`is_moe_layer`).
        rms_norm_eps: RMSNorm epsilon.
        zero_centered_norms: norms scale by ``1 + w`` (qwen3_next) instead of ``w``.
        max_position_embeddings: longest context the checkpoint declares (tokens).
        tie_word_embeddings: lm_head shares ``embed_tokens``.
        torch_dtype: the checkpoint's stored dtype name (``"bfloat16"``...), informational.
        bos_token_id: or None.
        eos_token_ids: ids from ``eos_token_id`` (int or list), possibly empty.
        attention_bias: q/k/v projections carry a bias (glm4_moe).
        qk_norm: per-head q/k RMSNorm before RoPE (always for Qwen; ``use_qk_norm`` for GLM).
        router_scoring: ``"softmax"`` (Qwen: softmax, top-k) or ``"sigmoid"`` (GLM, DeepSeek-V3
            style: sigmoid scores plus ``e_score_correction_bias`` choose the experts within the
            ``topk_group`` best of ``n_group`` groups; weights are the unbiased scores).
        n_group, topk_group: expert groups and how many of them a token may use (sigmoid).
        routed_scaling_factor: multiplies the (renormalised) routed weights (sigmoid).
        shared_expert_gated: the shared expert is scaled by ``sigmoid(x @ shared_expert_gate)``
            (Qwen) or added as is (GLM ``shared_experts``).
        mtp_layers: multi-token-prediction layers the checkpoint stores as
            ``model.layers.{L + i}`` (GLM ``num_nextn_predict_layers``), not loaded.
        sliding_window: keys a ``"sliding_attention"`` layer sees, itself included (gpt-oss
            128); 0 when no layer slides.
        attention_sinks: one learned logit per query head joins each softmax (gpt-oss).
        o_proj_bias: ``o_proj`` carries a bias (gpt-oss ``attention_bias`` covers q/k/v/o).
        yarn: YaRN RoPE scaling (gpt-oss), or None for plain RoPE.
        swiglu_limit, swiglu_alpha: gpt-oss's clamped expert activation
            ``(clamp(u, -l, l) + 1) * g' * sigmoid(alpha * g')``, ``g' = min(g, l)``; limit 0
            keeps the plain SwiGLU.
        expert_bias: routed experts carry gate_up / down biases (gpt-oss).
        router_bias: the router ``x @ W.T + b`` carries a bias (gpt-oss; with
            ``router_scoring == "topk_softmax"``: top-k of the logits, softmax over those k).
        quant_method: how the checkpoint's weights are stored: None (plain), ``"fp8"``,
            ``"mxfp4"`` (gpt-oss experts) or ``"nvfp4"`` (ModelOpt).
        quant_block: fp8's ``weight_block_size`` (rows, columns of one scale block), or None.
    """

    arch: str
    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    partial_rotary_factor: float
    rope_theta: float
    linear_conv_kernel_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    num_experts: int
    num_experts_per_tok: int
    norm_topk_prob: bool
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    intermediate_size: int
    decoder_sparse_step: int
    mlp_only_layers: tuple[int, ...]
    rms_norm_eps: float
    zero_centered_norms: bool
    max_position_embeddings: int
    tie_word_embeddings: bool
    torch_dtype: str | None
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    attention_bias: bool = False
    qk_norm: bool = True
    router_scoring: str = "softmax"
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    shared_expert_gated: bool = True
    mtp_layers: int = 0
    sliding_window: int = 0
    attention_sinks: bool = False
    o_proj_bias: bool = False
    yarn: YarnRope | None = None
    swiglu_limit: float = 0.0
    swiglu_alpha: float = 1.702
    expert_bias: bool = False
    router_bias: bool = False
    quant_method: str | None = None
    quant_block: tuple[int, int] | None = None

    @property
    def rotary_dim(self) -> int:
        """Number of leading head dims RoPE rotates: ``int(head_dim * partial_rotary_factor)``."""
        return int(self.head_dim * self.partial_rotary_factor)

    def is_moe_layer(self, layer: int) -> bool:
        """True when layer ``layer`` (0-based) has a sparse MoE block, else a dense SwiGLU MLP.

        Rule of ``Qwen3MoeDecoderLayer`` / ``Qwen3NextDecoderLayer``: not in ``mlp_only_layers``
        and ``(layer + 1) % decoder_sparse_step == 0``.
        """
        return (
            self.num_experts > 0
            and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0
        )

    @classmethod
    def from_file(cls, path: str | Path) -> "ModelConfig":
        """Parse ``path`` (a ``config.json`` file or a checkpoint directory).

        Raises:
            FileNotFoundError: no config.json.
            ValueError: invalid JSON or any bad/missing key (see :meth:`from_hf`).
        """
        path = Path(path)
        file = path / "config.json" if path.is_dir() else path
        if not file.is_file():
            raise FileNotFoundError(f"no config.json at {file}")
        try:
            raw = json.loads(file.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{file}: invalid JSON: {exc}") from exc
        return cls.from_hf(raw)

    @classmethod
    def from_hf(cls, config: dict) -> "ModelConfig":
        """Build the engine view of an HF ``config.json`` dict.

        Raises:
            ValueError: unsupported ``architectures[0]`` (message lists the supported ones), a
                ``model_type`` that does not match it, a missing required key or a value of the
                wrong type / out of range (the message names the key), a quantised checkpoint,
                or a feature this engine does not implement (sliding window, RoPE scaling,
                attention bias, non-silu act).
        """
        if not isinstance(config, dict):
            raise ValueError(f"config.json must be a JSON object, got {type(config).__name__}")
        archs = config.get("architectures")
        if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
            raise ValueError("config.json: 'architectures' must be a non-empty list of strings")
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise unsupported_architecture_error(arch)
        model_type = SUPPORTED_ARCHITECTURES[arch]
        if config.get("model_type") != model_type:
            raise ValueError(
                f"config.json: 'model_type' is {config.get('model_type')!r}, "
                f"expected {model_type!r} for {arch}"
            )
        config = _text_config(config) if model_type == "qwen3_5_moe" else config
        oss = model_type == "gpt_oss"
        quant_method = _refuse_quantized(config, oss)
        model_type = FAMILY_OF_MODEL_TYPE.get(model_type, model_type)
        qwen3_5, glm = model_type == "qwen3_5_moe", model_type == "glm4_moe"
        r = _Reader(config)
        if config.get("hidden_act", "silu") != "silu":
            raise ValueError(
                f"config.json: 'hidden_act' {config['hidden_act']!r} is unsupported (only 'silu')"
            )
        attention_bias = r.bool("attention_bias", oss)
        if attention_bias and not (glm or oss):
            raise ValueError("config.json: 'attention_bias' true is unsupported")
        if r.bool("use_sliding_window", False):
            raise ValueError("config.json: 'use_sliding_window' true is unsupported")
        hidden = r.int("hidden_size")
        layers = r.int("num_hidden_layers")
        heads = r.int("num_attention_heads")
        kv_heads = r.int("num_key_value_heads")
        if heads % kv_heads:
            raise ValueError(
                f"config.json: 'num_attention_heads' {heads} is not a multiple of "
                f"'num_key_value_heads' {kv_heads}"
            )
        head_dim = r.int("head_dim", hidden // heads)
        oss_fields = gpt_oss_fields(config, r, layers) if oss else {}
        theta, partial = (oss_fields.pop("rope_theta"), 1.0) if oss else _rope(config, r,
                                                                                 model_type)
        if int(head_dim * partial) % 2 or int(head_dim * partial) == 0:
            raise ValueError(
                f"config.json: 'partial_rotary_factor' {partial} gives an odd or zero rotary dim"
            )
        next_ = model_type in HYBRID_FAMILIES
        layer_types = (_layer_types(config, r, layers) if next_ else oss_fields.pop("layer_types")
                       if oss else ("full_attention",) * layers)
        gdn = dict.fromkeys(_GDN_KEYS, 0)
        if "linear_attention" in layer_types:
            gdn = {k: r.int(k) for k in gdn}
            if gdn["linear_num_value_heads"] % gdn["linear_num_key_heads"]:
                raise ValueError(
                    "config.json: 'linear_num_value_heads' is not a multiple of "
                    "'linear_num_key_heads'"
                )
        experts = r.int("n_routed_experts" if glm else "num_local_experts" if oss
                        else "num_experts", minimum=0)
        top_k = r.int("num_experts_per_tok", r.int("experts_per_token", 0, minimum=0) or None)
        if experts and top_k > experts:
            raise ValueError(
                f"config.json: 'num_experts_per_tok' {top_k} > 'num_experts' {experts}"
            )
        # Qwen3.5-MoE: every layer is MoE and routing always renormalises (the v5 config class
        # drops these keys, so values left in a file are ignored as transformers does).
        mlp_only = [] if qwen3_5 else config.get("mlp_only_layers") or []
        glm_fields = _glm_fields(r, experts, top_k) if glm else {}
        if glm:  # the first first_k_dense_replace layers are dense
            mlp_only = list(range(min(r.int("first_k_dense_replace", 1, minimum=0), layers)))
        if not isinstance(mlp_only, list) or any(type(i) is not int for i in mlp_only):
            raise ValueError(
                f"config.json: 'mlp_only_layers' must be a list of layer indices, got {mlp_only!r}"
            )
        sparse_step = 1 if qwen3_5 or oss else r.int("decoder_sparse_step", 1)
        dense = any(i in mlp_only or (i + 1) % sparse_step or not experts for i in range(layers))
        eos = config.get("eos_token_id")
        eos_ids = tuple(i for i in (eos if isinstance(eos, list) else [eos]) if isinstance(i, int))
        bos = config.get("bos_token_id")
        return cls(
            arch=arch,
            model_type=model_type,
            vocab_size=r.int("vocab_size"),
            hidden_size=hidden,
            num_hidden_layers=layers,
            layer_types=layer_types,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            partial_rotary_factor=partial,
            rope_theta=theta,
            **gdn,
            num_experts=experts,
            num_experts_per_tok=top_k,
            norm_topk_prob=True if qwen3_5 or oss else r.bool("norm_topk_prob",
                                                              True if glm else None),
            moe_intermediate_size=(r.int("intermediate_size" if oss else "moe_intermediate_size")
                                   if experts else 0),
            shared_expert_intermediate_size=(
                r.int("shared_expert_intermediate_size") if next_
                else r.int("n_shared_experts", 1, minimum=0) * r.int("moe_intermediate_size")
                if glm else 0
            ),
            intermediate_size=r.int("intermediate_size") if dense and not oss else 0,
            decoder_sparse_step=sparse_step,
            mlp_only_layers=tuple(mlp_only),
            rms_norm_eps=r.float("rms_norm_eps"),
            zero_centered_norms=next_,
            max_position_embeddings=r.int("max_position_embeddings"),
            tie_word_embeddings=r.bool("tie_word_embeddings", False),
            torch_dtype=config.get("torch_dtype") or config.get("dtype"),
            bos_token_id=bos if isinstance(bos, int) and not isinstance(bos, bool) else None,
            eos_token_ids=eos_ids,
            attention_bias=attention_bias,
            qk_norm=r.bool("use_qk_norm", False) if glm else not oss,
            **glm_fields,
            **oss_fields,
            quant_method=quant_method,
            quant_block=(tuple(config["quantization_config"]["weight_block_size"])
                         if quant_method == "fp8" else None),
        )


def _rope(config: dict, r: _Reader, model_type: str) -> tuple[float, float]:
    """(rope_theta, partial_rotary_factor) from top-level keys (v4) or ``rope_parameters`` (v5)."""
    params = config.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise ValueError(f"config.json: 'rope_parameters' must be an object, got {params!r}")
    params = params or {}
    scaling = config.get("rope_scaling")
    rope_type = params.get("rope_type", "default")
    if scaling is not None or rope_type != "default":
        raise ValueError("config.json: 'rope_scaling' / non-default 'rope_type' is unsupported")
    theta = params.get("rope_theta", config.get("rope_theta"))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
        raise ValueError(f"config.json: missing or invalid 'rope_theta' ({theta!r})")
    default_partial = {"glm4_moe": 0.5}.get(model_type, 0.25 if model_type in HYBRID_FAMILIES
                                                              else 1.0)
    partial = config.get("partial_rotary_factor", default_partial)
    partial = params.get("partial_rotary_factor", partial)
    if isinstance(partial, bool) or not isinstance(partial, (int, float)) or not 0 < partial <= 1:
        raise ValueError(f"config.json: 'partial_rotary_factor' must be in (0, 1], got {partial!r}")
    section = params.get("mrope_section")
    if section is not None:
        # Text-only input gives all three M-RoPE position streams the token position, so the
        # sections only partition the rotary frequencies: plain 1-D RoPE when they cover them.
        rotary = int(r.int("head_dim", r.int("hidden_size") // r.int("num_attention_heads"))
                     * partial)
        if (not isinstance(section, list) or any(type(n) is not int or n < 0 for n in section)
                or sum(section) != rotary // 2):
            raise ValueError(f"config.json: 'mrope_section' {section!r} must be non-negative "
                             f"integers summing to rotary_dim / 2 = {rotary // 2}")
    return float(theta), float(partial)


def _glm_fields(r: _Reader, experts: int, top_k: int) -> dict:
    """GLM-4.5's router and MTP keys (transformers ``Glm4MoeTopkRouter``), validated."""
    groups = r.int("n_group", 1)
    chosen = r.int("topk_group", 1)
    if experts % groups or chosen > groups:
        raise ValueError(f"config.json: 'n_group' {groups} must divide 'n_routed_experts' "
                         f"{experts} and be >= 'topk_group' {chosen}")
    if experts // groups < 2:
        raise ValueError("config.json: each of 'n_group' groups needs at least 2 experts "
                         "(a group scores by its two best)")
    if top_k > chosen * (experts // groups):
        raise ValueError(f"config.json: 'num_experts_per_tok' {top_k} exceeds the experts of "
                         f"'topk_group' {chosen} groups")
    return {
        "router_scoring": "sigmoid",
        "n_group": groups,
        "topk_group": chosen,
        "routed_scaling_factor": r.float("routed_scaling_factor", 1.0),
        "shared_expert_gated": False,
        "mtp_layers": r.int("num_nextn_predict_layers", 0, minimum=0),
    }


def _text_config(config: dict) -> dict:
    """The ``text_config`` of a multimodal release as a flat config (the vision tower is not
    served); ``tie_word_embeddings`` is read from the top level, where the releases put it."""
    text = config.get("text_config")
    if not isinstance(text, dict):
        raise ValueError("config.json: 'text_config' must be an object for "
                         f"{config['architectures'][0]}")
    flat = dict(text)
    flat["architectures"] = config["architectures"]
    for key in ("tie_word_embeddings", "quantization_config", "torch_dtype", "dtype"):
        if key in config:
            flat[key] = config[key]
    return flat


def _refuse_quantized(config: dict, gpt_oss: bool) -> str | None:
    """The checkpoint's served quantisation (None, ``"fp8"``, ``"mxfp4"``, ``"nvfp4"``); any
    ``quantization_config`` the loader cannot read is refused before anything is loaded.

    Served: FP8 block quantisation (``quant_method: "fp8"``, e4m3 values, ``weight_block_size``
    blocks, dynamic activations: the official -FP8 releases) and NVIDIA ModelOpt NVFP4
    (``quant_method: "modelopt"``, ``quant_algo: "NVFP4"``, groups of 16), both dequantised as
    read except for offloaded experts; for gpt-oss its released MXFP4 experts only.
    """
    quant = config.get("quantization_config")
    if quant is None:
        return None
    method = quant.get("quant_method") if isinstance(quant, dict) else quant
    if gpt_oss:
        if method != "mxfp4":
            raise ValueError(f"config.json: quantised gpt_oss checkpoints (quant_method "
                             f"{method!r}) are not served (served: the released 'mxfp4' "
                             f"experts, or bf16)")
        return "mxfp4"
    if method == "modelopt":
        algo = quant.get("quant_algo")
        if algo != "NVFP4" or quant.get("group_size", 16) != 16:
            raise ValueError(f"config.json: ModelOpt quant_algo {algo!r} (group_size "
                             f"{quant.get('group_size', 16)!r}) is not served (served: NVFP4 "
                             f"with groups of 16)")
        return "nvfp4"
    if method != "fp8":
        raise ValueError(f"config.json: quantised checkpoints (quant_method {method!r}) are not "
                         f"served yet (served: 'fp8' block quantisation, ModelOpt NVFP4); use "
                         f"the bf16 release of this model")
    block = quant.get("weight_block_size")
    if (not isinstance(block, list) or len(block) != 2
            or any(type(n) is not int or n < 1 for n in block)):
        raise ValueError(f"config.json: fp8 'weight_block_size' must be two positive integers, "
                         f"got {block!r}")
    if quant.get("fmt", "e4m3") != "e4m3" or quant.get("activation_scheme",
                                                       "dynamic") != "dynamic":
        raise ValueError("config.json: only fp8 e4m3 weights with dynamic activation scaling "
                         f"are served, got fmt {quant.get('fmt')!r}, activation_scheme "
                         f"{quant.get('activation_scheme')!r}")
    return "fp8"


def _layer_types(config: dict, r: _Reader, layers: int) -> tuple[str, ...]:
    """Qwen3-Next ``layer_types``: the explicit list, else every ``full_attention_interval``-th
    layer is full attention."""
    explicit = config.get("layer_types")
    if explicit is None:
        interval = r.int("full_attention_interval")
        full = {i for i in range(layers) if (i + 1) % interval == 0}
        return tuple("full_attention" if i in full else "linear_attention" for i in range(layers))
    if not isinstance(explicit, list) or len(explicit) != layers:
        raise ValueError(f"config.json: 'layer_types' must be a list of {layers} entries")
    types = tuple(_LEGACY_LAYER_TYPES.get(t, t) for t in explicit)
    bad = sorted({t for t in types if t not in ("full_attention", "linear_attention")}, key=str)
    if bad:
        raise ValueError(f"config.json: 'layer_types' has unsupported entries {bad}")
    return types
