"""The ``gpt_oss`` family of ``convert_gguf.py``: gpt-oss-20b / 120b (``GptOssForCausalLM``) ->
llama.cpp arch ``gpt-oss`` (``LLM_ARCH_OPENAI_MOE``).

Read from llama.cpp ``src/models/openai-moe.cpp`` (``load_arch_hparams``, ``load_arch_tensors``,
the graph), ``build_moe_ffn`` in ``src/llama-graph.cpp``, ``llama_hparams::is_masked_swa``, the
YaRN cparams of ``src/llama-context.cpp``, ggml's ``block_mxfp4`` (``ggml-common.h``) and
``dequantize_row_mxfp4`` (``ggml-quants.c``); the HF side from transformers
``modeling_gpt_oss.py``. Per layer i (E experts of width I, nq / nkv heads of dim D):

======================================================  ===========================  ==============
HF tensor (PyTorch shape), under ``model.layers.i.``    GGUF tensor                  ggml ne
======================================================  ===========================  ==============
input_layernorm.weight [H]                              blk.i.attn_norm.weight       {H}
post_attention_layernorm.weight [H]                     blk.i.post_attention_norm    {H}
self_attn.{q,k,v}_proj.weight [n*D, H]                  blk.i.attn_{q,k,v}.weight    {H, n*D}
self_attn.{q,k,v}_proj.bias [n*D]                       blk.i.attn_{q,k,v}.bias      {n*D}
self_attn.o_proj.weight [H, nq*D], .bias [H]            blk.i.attn_output.{w,b}      {nq*D, H} {H}
self_attn.sinks [nq]                                    blk.i.attn_sinks.weight      {nq}
mlp.router.weight [E, H], .bias [E]                     blk.i.ffn_gate_inp.{w,b}     {H, E} {E}
mlp.experts.gate_up_proj_{blocks,scales}, even rows     blk.i.ffn_gate_exps.weight   {H, I, E}
mlp.experts.gate_up_proj_{blocks,scales}, odd rows      blk.i.ffn_up_exps.weight     {H, I, E}
mlp.experts.down_proj_{blocks,scales}                   blk.i.ffn_down_exps.weight   {I, H, E}
mlp.experts.gate_up_proj_bias [E, 2I], even / odd       blk.i.ffn_{gate,up}_exps.b   {I, E}
mlp.experts.down_proj_bias [E, H]                       blk.i.ffn_down_exps.bias     {H, E}
======================================================  ===========================  ==============

The embeddings, ``model.norm`` and ``lm_head`` map as for qwen3_moe; llama.cpp's loader requires
``output.weight``, so a tied checkpoint gets the embedding matrix again. The ``*_blocks [E, out,
in/32, 16]`` / ``*_scales [E, out, in/32]`` uint8 pairs are the MXFP4 releases; the bf16 layout
(``--expert-format bf16`` of ``freetoken make-tiny``) has ``experts.gate_up_proj [E, H, 2I]`` and
``experts.down_proj [E, I, H]`` stored [in, out], transposed here. Gate and up rows interleave
(gate even, up odd) in both; llama.cpp takes them as two tensors.

MXFP4: both formats cut a row into blocks of 32 consecutive elements, each one E8M0 scale byte s
and 16 bytes of E2M1 codes, value ``e2m1(code) * 2^(s - 127)`` (ggml's table holds doubled E2M1
values and its scale is halved: the same products). Only the nibble order differs: HF byte j of
a block holds elements 2j (low nibble) and 2j + 1 (high); ggml's 17-byte ``block_mxfp4`` is the
scale byte, then byte j holds elements j (low) and j + 16 (high). :func:`repack_mxfp4` moves the
nibbles (``mxfp4_np.py``), so the GGUF holds the released 4.25 bits per weight exactly
(``--outtype mxfp4``, the default for these checkpoints); ``f32`` / ``bf16`` write
:func:`dequantize_mxfp4` values, exact
in both (at most two significant bits times a power of two). A scale byte 255 (E8M0 NaN) is
refused: transformers decodes it as inf, ggml as 2^127. The biases are always f32 (ggml's CPU
``add_id`` reads f32 only).

The graphs agree on: the sliding window W (position p sees keys p - W < j <= p: transformers'
``sliding_window_overlay``, FreeToken, and llama.cpp's ``LLAMA_SWA_TYPE_STANDARD`` which masks
p - j >= W); the per-head sink logit joining the softmax (``ggml_soft_max_ext`` sinks); the scale
1/sqrt(D); NEOX RoPE over all D dims; the router (top-k of the biased logits, softmax over those
k: ``SOFTMAX_WEIGHT``, no renormalisation or scale); the expert output ``weight * (W_down act +
b_down)`` with ``act = min(g, 7) * sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1)``.

Hyper-parameters beyond the common ones: expert_count (``num_local_experts``), expert_used_count
(``num_experts_per_tok``, else ``experts_per_token``), expert_feed_forward_length (I),
attention.sliding_window (W), attention.sliding_window_pattern (one bool per layer, true for
``sliding_attention``: the loader reads the array before its default period of 2, sliding
first), and for YaRN rope.scaling.type / factor / original_context_length, plus
rope.scaling.attn_factor = attention_factor / (0.1 ln s + 1) only when the config sets
``attention_factor`` (llama.cpp multiplies by its own 0.1 ln s + 1, transformers' default).

Refused: ``swiglu_limit`` other than 7.0 or ``swiglu_alpha`` other than 1.702 (constants of
llama.cpp's graph), YaRN ``beta_fast`` / ``beta_slow`` other than 32 / 1 (the gpt-oss loader
never reads the yarn beta keys, so its defaults 32 / 1 apply), ``mscale`` keys, rope types other
than yarn / default, ``attention_bias: false`` (the loader requires ``attn_output.bias``),
``layer_types`` entries other than sliding_attention / full_attention, and ``--outtype mxfp4`` on
bf16 experts (this converter does not quantise).

Converted with a note (:func:`notes`), not reproducible: YaRN ``truncate: false`` (the released
configs). transformers (and FreeToken) keep the correction range [low, high] fractional, while
ggml's ``ggml_rope_yarn_corr_dims`` always floors low and ceils high: for D 64, theta 150000,
original context 4096 that is [8.09, 17.40] against [8, 18], so rotary pairs 9..17 of 32 keep
other shares of their original frequency (pair 12: 0.580 against 0.600). The angles drift apart
linearly with the position, by up to 2.2e-4 rad per position (0.9 rad at position 4096);
``truncate: true`` checkpoints are reproduced.
"""

from __future__ import annotations

import math

import gguf  # pinned gguf==0.19.0 in the peer venv
import numpy as np

from gguf_plan import ConversionError, Planned, T, one, tensor_name
from mxfp4_np import dequantize_mxfp4, repack_mxfp4

ARCH = gguf.MODEL_ARCH.GPT_OSS
SWIGLU = {"swiglu_limit": 7.0, "swiglu_alpha": 1.702}  # llama.cpp build_moe_ffn constants
YARN_BETAS = {"beta_fast": 32.0, "beta_slow": 1.0}  # llama_hparams defaults, never read
DEFAULT_YARN = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 4096}  # GptOssConfig's
_LAYER_TYPES = ("sliding_attention", "full_attention")
_ATTN = {"q_proj": T.ATTN_Q, "k_proj": T.ATTN_K, "v_proj": T.ATTN_V, "o_proj": T.ATTN_OUT}
_GATE, _UP, _ALL = slice(0, None, 2), slice(1, None, 2), slice(None)


def layer_types(config: dict) -> list[str]:
    """``layer_types``, default alternating from a sliding layer 0 (as FreeToken and
    transformers).

    Raises:
        ConversionError: not one entry per layer from :data:`_LAYER_TYPES`.
    """
    layers = config["num_hidden_layers"]
    types = config.get("layer_types") or [_LAYER_TYPES[i % 2] for i in range(layers)]
    if len(types) != layers or any(t not in _LAYER_TYPES for t in types):
        raise ConversionError(f"layer_types must list {layers} entries from "
                              f"{', '.join(_LAYER_TYPES)}")
    return list(types)


def yarn(config: dict) -> dict | None:
    """The YaRN parameters (``rope_parameters`` of transformers v5, else ``rope_scaling``;
    GptOssConfig's default when neither key is present), or None for plain RoPE.

    Raises:
        ConversionError: a rope type other than yarn / default, or YaRN settings llama.cpp's
            gpt-oss graph cannot run (module docstring).
    """
    if "rope_parameters" in config:
        params = config["rope_parameters"]
    else:
        params = config.get("rope_scaling", DEFAULT_YARN)
    if not params:
        return None
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return None
    if kind != "yarn":
        raise ConversionError(f"rope_type {kind!r}: llama.cpp's gpt-oss is mapped for yarn or "
                              "plain RoPE only")
    for key, value in YARN_BETAS.items():
        if float(params.get(key) or value) != value:
            raise ConversionError(f"yarn {key} {params[key]!r}: llama.cpp's gpt-oss loader does "
                                  f"not read it and uses {value:g}")
    if params.get("mscale") or params.get("mscale_all_dim"):
        raise ConversionError("yarn mscale / mscale_all_dim are not mapped")
    if not (isinstance(params.get("factor"), (int, float)) and params["factor"] > 0):
        raise ConversionError(f"yarn factor {params.get('factor')!r} must be a positive number")
    if not isinstance(params.get("original_max_position_embeddings"), int):
        raise ConversionError("yarn needs an integer original_max_position_embeddings")
    return params


def check(config: dict) -> None:
    """Refuse what llama.cpp's gpt-oss cannot run as the HF model does (module docstring)."""
    for key, value in SWIGLU.items():
        if float(config.get(key, value)) != value:
            raise ConversionError(f"{key} {config[key]!r}: llama.cpp's gpt-oss hard-codes "
                                  f"{value:g}")
    if not config.get("attention_bias", True):
        raise ConversionError("attention_bias=false: llama.cpp's gpt-oss loader requires "
                              "attn_output.bias")
    layer_types(config)
    yarn(config)


def yarn_ranges(config: dict, head_dim: int, theta: float) -> tuple[tuple[float, float],
                                                                    tuple[int, int]]:
    """YaRN's correction range [low, high] (in rotary pairs) as transformers computes it with
    ``truncate: false``, and as ggml's ``ggml_rope_yarn_corr_dims`` rounds it (floor, ceil)."""
    params = yarn(config) or DEFAULT_YARN
    orig = params["original_max_position_embeddings"]

    def dim(rotations: float) -> float:
        return head_dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = max(dim(YARN_BETAS["beta_fast"]), 0.0), min(dim(YARN_BETAS["beta_slow"]),
                                                            head_dim - 1.0)
    return (low, high), (max(math.floor(low), 0), min(math.ceil(high), head_dim - 1))


def notes(config: dict, head_dim: int, theta: float) -> list[str]:
    """What the GGUF computes differently from the checkpoint (module docstring), one line
    each; empty when nothing."""
    params = yarn(config)
    if params is None or params.get("truncate", True):
        return []
    (low, high), (rlow, rhigh) = yarn_ranges(config, head_dim, theta)
    pairs = [i for i in range(head_dim // 2)
             if _ramp(i, low, high) != _ramp(i, rlow, rhigh)]
    span = f"{pairs[0]}..{pairs[-1]}" if pairs else "none"
    return [f"note: yarn truncate=false: llama.cpp rounds the correction range [{low:.3f}, "
            f"{high:.3f}] to [{rlow}, {rhigh}] (ggml_rope_yarn_corr_dims), so rotary pairs {span} "
            f"of {head_dim // 2} rotate at other frequencies than in transformers / FreeToken"]


def _ramp(i: int, low: float, high: float) -> float:
    return min(1.0, max(0.0, (i - low) / max(high - low, 0.001)))


def experts_mxfp4(shapes: dict) -> bool:
    """Whether the checkpoint's experts are the released MXFP4 blocks and scales."""
    return "model.layers.0.mlp.experts.gate_up_proj_blocks" in shapes


def _mxfp4_rows(rows: slice, as_mxfp4: bool):
    """``Planned.parts`` of one expert weight: the ``rows`` of [blocks, scales] as ggml MXFP4
    bytes or as float32 values."""
    def read(parts: list[np.ndarray]) -> np.ndarray:
        blocks, scales = (np.asarray(p)[:, rows] for p in parts)
        if (scales == 255).any():
            raise ConversionError("an MXFP4 scale byte is 255 (E8M0 NaN): transformers decodes "
                                  "it as inf, ggml as 2^127")
        return repack_mxfp4(blocks, scales) if as_mxfp4 else dequantize_mxfp4(blocks, scales)
    return read


def _transposed(cols: slice):
    """``Planned.fn`` of a bf16-layout expert weight ``[E, in, out]``: the ``cols`` of out,
    as ``[E, out', in]``."""
    return lambda w: np.ascontiguousarray(w[:, :, cols].transpose(0, 2, 1))


def _experts(config: dict, shapes: dict, i: int, as_mxfp4: bool) -> list[Planned]:
    pre = f"model.layers.{i}.mlp.experts."
    e, h, inter = config["num_local_experts"], config["hidden_size"], config["intermediate_size"]
    weights = {T.FFN_GATE_EXP: ("gate_up_proj", _GATE, (e, inter, h)),
               T.FFN_UP_EXP: ("gate_up_proj", _UP, (e, inter, h)),
               T.FFN_DOWN_EXP: ("down_proj", _ALL, (e, h, inter))}
    qtype = gguf.GGMLQuantizationType.MXFP4 if as_mxfp4 else None
    out = []
    for kind, (proj, rows, shape) in weights.items():
        if experts_mxfp4(shapes):
            out.append(Planned(tensor_name(kind, i), kind, [f"{pre}{proj}_blocks",
                                                            f"{pre}{proj}_scales"],
                               shape, parts=_mxfp4_rows(rows, as_mxfp4), qtype=qtype))
        else:
            out.append(one(shapes, pre + proj, kind, i, _transposed(rows), shape))
        out.append(one(shapes, f"{pre}{proj}_bias", kind, i,
                       lambda b, rows=rows: np.ascontiguousarray(b[:, rows]), shape[:2],
                       suffix=".bias"))
    return out


def plan(config: dict, shapes: dict, as_mxfp4: bool) -> list[Planned]:
    """The per-layer GGUF tensors (the global ones are planned by ``convert_gguf.py``, plus
    ``output.weight`` from the embeddings when tied); experts as MXFP4 when ``as_mxfp4``.

    Raises:
        ConversionError: ``as_mxfp4`` on bf16 experts.
    """
    if as_mxfp4 and not experts_mxfp4(shapes):
        raise ConversionError("--outtype mxfp4 needs MXFP4 experts (*_blocks / *_scales); this "
                              "converter does not quantise bf16 ones: use f32 or bf16")
    out = []
    if config.get("tie_word_embeddings"):
        out.append(one(shapes, "model.embed_tokens.weight", T.OUTPUT))
    for i in range(config["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        att = pre + "self_attn."
        out.append(one(shapes, pre + "input_layernorm.weight", T.ATTN_NORM, i))
        for proj, kind in _ATTN.items():
            out += [one(shapes, f"{att}{proj}.weight", kind, i),
                    one(shapes, f"{att}{proj}.bias", kind, i, suffix=".bias")]
        out.append(one(shapes, att + "sinks", T.ATTN_SINKS, i))
        out.append(one(shapes, pre + "post_attention_layernorm.weight", T.ATTN_POST_NORM, i))
        out += [one(shapes, pre + "mlp.router.weight", T.FFN_GATE_INP, i),
                one(shapes, pre + "mlp.router.bias", T.FFN_GATE_INP, i, suffix=".bias")]
        out += _experts(config, shapes, i, as_mxfp4)
    return out


def top_k(config: dict) -> int:
    """Experts per token: ``num_experts_per_tok``, else ``experts_per_token`` (as FreeToken)."""
    return int(config.get("num_experts_per_tok") or config["experts_per_token"])


def add_hparams(w: gguf.GGUFWriter, config: dict) -> None:
    """The MoE, sliding-window and YaRN keys llama.cpp's gpt-oss loader reads (module
    docstring)."""
    w.add_expert_count(config["num_local_experts"])
    w.add_expert_used_count(top_k(config))
    w.add_expert_feed_forward_length(config["intermediate_size"])
    w.add_sliding_window(int(config.get("sliding_window") or 128))
    w.add_sliding_window_pattern([t == "sliding_attention" for t in layer_types(config)])
    if (params := yarn(config)) is None:
        return
    factor = float(params["factor"])
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(factor)
    w.add_rope_scaling_orig_ctx_len(params["original_max_position_embeddings"])
    if params.get("attention_factor") is not None:
        default = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
        w.add_rope_scaling_attn_factors(float(params["attention_factor"]) / default)
