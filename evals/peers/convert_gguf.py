"""Convert a FreeToken / Hugging Face ``qwen3_moe``, ``qwen3_next``, ``qwen3_5_moe``, ``glm4_moe``
or ``gpt_oss`` checkpoint to a GGUF file for llama.cpp.

Usage (run with the peer virtualenv's python, which has numpy + ``gguf==0.19.0``)::

    python evals/peers/convert_gguf.py MODEL_DIR OUT.gguf [--outtype f32|bf16|f16|mxfp4]

Written for FreeToken from llama.cpp's published layout (read, not copied): the architecture
string, tensor names and metadata keys come from the ``gguf`` package at run time
(``gguf.MODEL_ARCH_NAMES``, ``gguf.TENSOR_NAMES``, ``GGUFWriter.add_*``); which tensors and keys
each graph loads, and in which shape, from llama.cpp ``src/models/qwen3moe.cpp`` and
``src/models/qwen3next.cpp``, ``src/models/qwen35moe.cpp`` (``load_arch_hparams`` /
``load_arch_tensors`` and the graph). The ``config.json`` ``model_type`` picks the family.
``glm4_moe`` (GLM-4.5 / 4.6 / 4.7 -> arch ``glm4moe``) is mapped in ``gguf_glm4_moe.py`` and
``gpt_oss`` (-> arch ``gpt-oss``: sinks, biases, sliding windows, YaRN, MXFP4 experts) in
``gguf_gpt_oss.py``, whose docstrings have their tables; the plan primitives all use are in
``gguf_plan.py``, the GGUF type and bytes of each tensor in ``gguf_encode.py``.

**qwen3_moe** -> arch ``qwen3moe``:

======================================================  ==========================  ===============
HF tensor (PyTorch shape)                               GGUF tensor                 ggml ne
======================================================  ==========================  ===============
model.embed_tokens.weight [V, H]                        token_embd.weight           {H, V}
model.norm.weight [H]                                   output_norm.weight          {H}
lm_head.weight [V, H] (absent when tied)                output.weight               {H, V}
layers.i.input_layernorm.weight [H]                     blk.i.attn_norm.weight      {H}
layers.i.self_attn.{q,k,v}_proj.weight [n*D, H]         blk.i.attn_{q,k,v}.weight   {H, n*D}
layers.i.self_attn.o_proj.weight [H, nq*D]              blk.i.attn_output.weight    {nq*D, H}
layers.i.self_attn.{q,k}_norm.weight [D]                blk.i.attn_{q,k}_norm       {D}
layers.i.post_attention_layernorm.weight [H]            blk.i.ffn_norm.weight       {H}
layers.i.mlp.gate.weight [E, H] (router)                blk.i.ffn_gate_inp.weight   {H, E}
layers.i.mlp.experts.e.{gate,up}_proj.weight [I, H]     blk.i.ffn_{gate,up}_exps    {H, I, E}
layers.i.mlp.experts.e.down_proj.weight [H, I]          blk.i.ffn_down_exps         {I, H, E}
======================================================  ==========================  ===============

GGUF stores dims reversed from numpy, so an array of numpy shape (E, I, H) has ne {H, I, E}; the
per-expert matrices are stacked on a new leading axis. No Q/K permutation: qwen3moe uses NEOX
(rotate-half) RoPE like the HF model. Hyper-parameters: block_count, context_length,
embedding_length, feed_forward_length, attention.head_count(_kv), attention.key/value_length
(head_dim), rope.freq_base, attention.layer_norm_rms_epsilon, expert_count, expert_used_count,
expert_feed_forward_length. llama.cpp's qwen3moe graph always renormalises the top-k weights
after a softmax, so a config with ``norm_topk_prob: false`` or rope scaling is refused.

**qwen3_next** -> arch ``qwen3next`` (Gated DeltaNet layers where ``(i + 1) %
full_attention_interval != 0``, gated full attention on the others; nk / nv linear key / value
heads of dims dk / dv, r = nv / nk, conv channels C = 2*nk*dk + nv*dv, shared expert width Is).
Embeddings, lm_head, router and routed experts as for qwen3_moe, plus:

======================================================  ===========================  ==============
HF tensor (PyTorch shape)                               GGUF tensor                  ggml ne
======================================================  ===========================  ==============
model.norm.weight [H]                         (+1)      output_norm.weight           {H}
layers.i.input_layernorm.weight [H]           (+1)      blk.i.attn_norm.weight       {H}
layers.i.post_attention_layernorm.weight [H]  (+1)      blk.i.post_attention_norm    {H}
full: self_attn.q_proj.weight [nq*2D, H]                blk.i.attn_q.weight          {H, nq*2D}
full: self_attn.{k,v}_proj.weight [nkv*D, H]            blk.i.attn_{k,v}.weight      {H, nkv*D}
full: self_attn.o_proj.weight [H, nq*D]                 blk.i.attn_output.weight     {nq*D, H}
full: self_attn.{q,k}_norm.weight [D]         (+1)      blk.i.attn_{q,k}_norm        {D}
linear: linear_attn.in_proj_qkvz.weight, q/k/v rows     blk.i.attn_qkv.weight        {H, C}
linear: linear_attn.in_proj_qkvz.weight, z rows         blk.i.attn_gate.weight       {H, nv*dv}
linear: linear_attn.in_proj_ba.weight [2*nv, H]         blk.i.ssm_ba.weight          {H, 2*nv}
linear: linear_attn.conv1d.weight [C, 1, K]   (squeeze) blk.i.ssm_conv1d.weight      {K, C}
linear: linear_attn.dt_bias [nv]                        blk.i.ssm_dt.bias            {nv}
linear: linear_attn.A_log [nv]                (-exp)    blk.i.ssm_a                  {nv}
linear: linear_attn.norm.weight [dv]                    blk.i.ssm_norm.weight        {dv}
linear: linear_attn.out_proj.weight [H, nv*dv]          blk.i.ssm_out.weight         {nv*dv, H}
mlp.shared_expert.{gate,up}_proj.weight [Is, H]         blk.i.ffn_{gate,up}_shexp    {H, Is}
mlp.shared_expert.down_proj.weight [H, Is]              blk.i.ffn_down_shexp         {Is, H}
mlp.shared_expert_gate.weight [1, H]          (flatten) blk.i.ffn_gate_inp_shexp     {H}
======================================================  ===========================  ==============

Transforms: the HF model's ``Qwen3NextRMSNorm`` scales by ``1 + weight`` (zero-centred) and
llama.cpp's RMS norm by ``weight``, so those norms get +1 (in float32, exact for bf16 weights);
the gated norm of the DeltaNet output (``linear_attn.norm``) already scales by ``weight`` and is
copied. ``A_log`` is stored as ``A = -exp(A_log)`` (the graph multiplies softplus(a + dt_bias)
by it). ``in_proj_qkvz`` holds, per key head g, rows [q_g (dk), k_g (dk), v_g (r*dv), z_g
(r*dv)]; it is regrouped into [q_0..q_{nk-1}, k_0.., v_0..] (``attn_qkv``, the conv input order
of both models) and [z_0..] (``attn_gate``): llama.cpp's fused path. ``in_proj_ba`` keeps its
per-key-head [b_g (r), a_g (r)] grouping, which llama.cpp splits the same way, and value head
g*r + j reads key head g in both. The gated q_proj keeps its per-head [query (D), gate (D)]
rows, the split llama.cpp makes. RoPE: NEOX on the first rope.dimension_count =
int(D * partial_rotary_factor) dims of each head, as in the HF model. ``mtp.*`` tensors (the
multi-token-prediction head of released checkpoints) are left out: llama.cpp decodes without it.
Extra hyper-parameters: expert_shared_feed_forward_length, rope.dimension_count,
full_attention_interval, ssm.conv_kernel (K), ssm.state_size (dk), ssm.group_count (nk),
ssm.time_step_rank (nv), ssm.inner_size (nv*dv). Refused: an explicit ``layer_types`` that is
not the interval pattern (gguf 0.19.0 has no per-layer key to write it), dk != dv (llama.cpp
takes both from ssm.state_size), nv not a multiple of nk, and the qwen3_moe refusals.

**qwen3_5_moe** -> arch ``qwen35moe`` (Qwen3.5 / 3.6 MoE). The text model's keys are read from
``text_config``, its tensors from ``model.language_model.`` (``lm_head.weight`` stays top-level);
``model.visual.*`` (vision tower) and ``mtp.*`` are left out. As qwen3_next, except:

======================================================  ===========================  ==============
HF tensor (PyTorch shape), under ``layers.i.``          GGUF tensor                  ggml ne
======================================================  ===========================  ==============
linear_attn.in_proj_qkv.weight [C, H]        (tile v)   blk.i.attn_qkv.weight        {H, C}
linear_attn.in_proj_z.weight [nv*dv, H]        (tile)   blk.i.attn_gate.weight       {H, nv*dv}
linear_attn.in_proj_{b,a}.weight [nv, H]       (tile)   blk.i.ssm_{beta,alpha}       {H, nv}
linear_attn.conv1d.weight [C, 1, K]  (squeeze, tile v)  blk.i.ssm_conv1d.weight      {K, C}
linear_attn.{A_log (-exp), dt_bias} [nv]       (tile)   blk.i.ssm_{a,dt.bias}        {nv}
linear_attn.out_proj.weight [H, nv*dv] (tile columns)   blk.i.ssm_out.weight         {nv*dv, H}
mlp.experts.gate_up_proj [E, 2I, H] (gate rows first)   blk.i.ffn_gate_up_exps       {H, 2I, E}
mlp.experts.down_proj [E, H, I]                         blk.i.ffn_down_exps          {I, H, E}
======================================================  ===========================  ==============

"tile": value head j of the HF model reads key head j // r (q/k repeat-interleaved), while
llama.cpp's qwen35moe broadcasts the nk key heads by tiling (value head h reads key head h % nk,
in ``ggml_repeat_4d`` and in the fused ``gated_delta_net`` kernel alike). Every per-value-head
axis (the v rows of qkv and of the conv, z, b, a, A_log, dt_bias, the out_proj columns) is
therefore reordered: HF head g*r + j goes to position j*nk + g. The fused gate_up tensor is
copied (llama.cpp splits it at I, gate first). RoPE: the graph runs interleaved M-RoPE, whose
fourth position stream is 0 for text tokens; ``rope.dimension_sections`` = [ceil(P/3),
ceil((P-1)/3), ceil((P-2)/3), 0] for P = rope.dimension_count / 2 rotary pairs sends every pair
to a stream holding the token position, i.e. plain NEOX RoPE as in the HF model on text (the
checkpoint's own ``mrope_section``, e.g. [6, 6, 4] for P = 16, can leave pairs on the zero
stream). No feed_forward_length (no dense FFN); routing always renormalises and every layer is
MoE (``norm_topk_prob`` / ``mlp_only_layers`` are not read, as in transformers). Refused as for
qwen3_next, plus ``attn_output_gate: false`` (the graph always gates).

dtype (``gguf_encode.py``): ``f32`` is exact for bf16/f16/f32 checkpoints; ``bf16`` is exact for
bf16 checkpoints; ``f16`` rounds; ``mxfp4`` (MXFP4 experts only, and their default) keeps the
experts' 4-bit codes and every other matrix in its stored dtype. 1-D tensors (norms, ``ssm_a``,
``ssm_dt``), biases, the routers and the conv kernel stay float32 in every mode.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gguf  # noqa: E402  (pinned gguf==0.19.0 in the peer venv)

import gguf_glm4_moe  # noqa: E402
import gguf_gpt_oss  # noqa: E402
from gguf_encode import OUTTYPES, add_tensor_info, encode, stored_shape, tensor_type  # noqa: E402
from gguf_plan import ConversionError, Planned, T  # noqa: E402
from gguf_plan import one as _one  # noqa: E402
from gguf_plan import stacked as _stacked  # noqa: E402
from gguf_vocab import load_vocab  # noqa: E402
from safetensors_np import SafetensorsCheckpoint  # noqa: E402

ARCHES = {"qwen3_moe": gguf.MODEL_ARCH.QWEN3MOE, "qwen3_next": gguf.MODEL_ARCH.QWEN3NEXT,
          "qwen3_5_moe": gguf.MODEL_ARCH.QWEN35MOE, "glm4_moe": gguf_glm4_moe.ARCH,
          "gpt_oss": gguf_gpt_oss.ARCH}
_HYBRID = ("qwen3_next", "qwen3_5_moe")  # Gated DeltaNet + gated attention, zero-centred norms
_GLOBAL_TENSORS = {"embed_tokens.weight": T.TOKEN_EMBD, "norm.weight": T.OUTPUT_NORM,
                   "lm_head.weight": T.OUTPUT}  # after the family's _PREFIX, lm_head top-level
_PREFIX = {"qwen3_5_moe": "model.language_model."}  # of the text model's tensors; else "model."
_ATTN_TENSORS = {  # HF suffix after "model.layers.{i}." -> gguf tensor kind
    "self_attn.q_proj.weight": T.ATTN_Q,
    "self_attn.k_proj.weight": T.ATTN_K,
    "self_attn.v_proj.weight": T.ATTN_V,
    "self_attn.o_proj.weight": T.ATTN_OUT,
    "self_attn.q_norm.weight": T.ATTN_Q_NORM,
    "self_attn.k_norm.weight": T.ATTN_K_NORM,
}
_EXPERT_TENSORS = {"gate_proj": T.FFN_GATE_EXP, "up_proj": T.FFN_UP_EXP,
                   "down_proj": T.FFN_DOWN_EXP}
_SHARED_EXPERT_TENSORS = {"gate_proj": T.FFN_GATE_SHEXP, "up_proj": T.FFN_UP_SHEXP,
                          "down_proj": T.FFN_DOWN_SHEXP}
_DELTANET_TENSORS = {  # qwen3_next linear-attention layers, copied as stored
    "linear_attn.in_proj_ba.weight": T.SSM_BETA_ALPHA,
    "linear_attn.dt_bias": T.SSM_DT,
    "linear_attn.norm.weight": T.SSM_NORM,
    "linear_attn.out_proj.weight": T.SSM_OUT,
}
_SKIPPED_PREFIXES = {"qwen3_next": ("mtp.",), "qwen3_5_moe": ("mtp.", "model.visual.")}


def _plus_one(x: np.ndarray) -> np.ndarray:
    """Zero-centred RMSNorm weight (the model scales by ``1 + w``) -> plain RMSNorm weight."""
    return x.astype(np.float32) + np.float32(1.0)


def _neg_exp(x: np.ndarray) -> np.ndarray:
    """``A_log`` -> ``A = -exp(A_log)``, rounded once to float32."""
    return (-np.exp(x.astype(np.float64))).astype(np.float32)


def _qkvz_split(config: dict, part: str) -> Callable[[np.ndarray], np.ndarray]:
    """``in_proj_qkvz`` [nk * (2*dk + 2*r*dv), H] (rows grouped per key head) -> its ``qkv``
    rows [q of every head, k of every head, v of every head] or its ``z`` rows."""
    nk, dk = config["linear_num_key_heads"], config["linear_key_head_dim"]
    rdv = config["linear_num_value_heads"] // nk * config["linear_value_head_dim"]

    def split(w: np.ndarray) -> np.ndarray:
        g = w.reshape(nk, 2 * dk + 2 * rdv, w.shape[-1])
        if part == "z":
            return np.ascontiguousarray(g[:, 2 * dk + rdv:].reshape(-1, w.shape[-1]))
        q, k, v = g[:, :dk], g[:, dk:2 * dk], g[:, 2 * dk:2 * dk + rdv]
        return np.concatenate([t.reshape(-1, w.shape[-1]) for t in (q, k, v)])

    return split


def _tile_heads(config: dict, size: int, axis: int = 0, skip: int = 0,
                pre: Callable[[np.ndarray], np.ndarray] | None = None
                ) -> Callable[[np.ndarray], np.ndarray]:
    """qwen3_5_moe: reorder the value-head blocks (``size`` entries each) along ``axis``, after
    its first ``skip`` entries, from HF's grouped order (head g*r + j) to llama.cpp's tiled one
    (position j*nk + g), after ``pre``."""
    nk = config["linear_num_key_heads"]
    r = config["linear_num_value_heads"] // nk

    def tile(w: np.ndarray) -> np.ndarray:
        w = np.moveaxis(pre(w) if pre else w, axis, 0)
        v = w[skip:]
        v = v.reshape(nk, r, size, *v.shape[1:]).swapaxes(0, 1).reshape(v.shape)
        return np.ascontiguousarray(np.moveaxis(np.concatenate([w[:skip], v]), 0, axis))

    return tile


def _is_linear(config: dict, layer: int) -> bool:
    """qwen3_next: whether ``layer`` is a Gated DeltaNet layer (llama.cpp's interval rule)."""
    return (layer + 1) % config.get("full_attention_interval", 4) != 0


def _experts(shapes: dict, config: dict, i: int) -> list[Planned]:
    pre = f"{_PREFIX.get(config['model_type'], 'model.')}layers.{i}.mlp.experts."
    if config["model_type"] == "qwen3_5_moe":  # fused, already stacked per expert
        return [_one(shapes, pre + "gate_up_proj", T.FFN_GATE_UP_EXP, i),
                _one(shapes, pre + "down_proj", T.FFN_DOWN_EXP, i)]
    return [_stacked(shapes, [f"{pre}{e}.{proj}.weight" for e in range(config["num_experts"])],
                     kind, i) for proj, kind in _EXPERT_TENSORS.items()]


def _plan_qwen3_moe(config: dict, shapes: dict) -> list[Planned]:
    plan = []
    for i in range(config["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        plan.append(_one(shapes, pre + "input_layernorm.weight", T.ATTN_NORM, i))
        plan += [_one(shapes, pre + s, k, i) for s, k in _ATTN_TENSORS.items()]
        plan.append(_one(shapes, pre + "post_attention_layernorm.weight", T.FFN_NORM, i))
        plan.append(_one(shapes, pre + "mlp.gate.weight", T.FFN_GATE_INP, i))
        plan += _experts(shapes, config, i)
    return plan


def _squeeze_conv(w: np.ndarray) -> np.ndarray:
    """conv1d weight [C, 1, K] -> [C, K]."""
    return w.reshape(w.shape[0], -1)


def _linear_qwen3_next(shapes: dict, config: dict, i: int, pre: str) -> list[Planned]:
    nk, dk = config["linear_num_key_heads"], config["linear_key_head_dim"]
    vdim = config["linear_num_value_heads"] * config["linear_value_head_dim"]
    qkvz, hidden = pre + "linear_attn.in_proj_qkvz.weight", config["hidden_size"]
    return [_one(shapes, qkvz, T.ATTN_QKV, i, _qkvz_split(config, "qkv"),
                 (2 * nk * dk + vdim, hidden)),
            _one(shapes, qkvz, T.ATTN_GATE, i, _qkvz_split(config, "z"), (vdim, hidden)),
            _one(shapes, pre + "linear_attn.conv1d.weight", T.SSM_CONV1D, i, _squeeze_conv,
                 (2 * nk * dk + vdim, config["linear_conv_kernel_dim"])),
            _one(shapes, pre + "linear_attn.A_log", T.SSM_A, i, _neg_exp),
            *[_one(shapes, pre + s, k, i) for s, k in _DELTANET_TENSORS.items()]]


def _linear_qwen3_5(shapes: dict, config: dict, i: int, pre: str) -> list[Planned]:
    """The four split projections copied with their value heads tiled (see the docstring)."""
    la, dv = pre + "linear_attn.", config["linear_value_head_dim"]
    qk = 2 * config["linear_num_key_heads"] * config["linear_key_head_dim"]
    conv = shapes.get(la + "conv1d.weight", (0,))[0], config["linear_conv_kernel_dim"]
    one = _tile_heads(config, 1)
    return [_one(shapes, la + "in_proj_qkv.weight", T.ATTN_QKV, i,
                 _tile_heads(config, dv, skip=qk)),
            _one(shapes, la + "in_proj_z.weight", T.ATTN_GATE, i, _tile_heads(config, dv)),
            _one(shapes, la + "in_proj_b.weight", T.SSM_BETA, i, one),
            _one(shapes, la + "in_proj_a.weight", T.SSM_ALPHA, i, one),
            _one(shapes, la + "conv1d.weight", T.SSM_CONV1D, i,
                 _tile_heads(config, dv, skip=qk, pre=_squeeze_conv), conv),
            _one(shapes, la + "A_log", T.SSM_A, i, _tile_heads(config, 1, pre=_neg_exp)),
            _one(shapes, la + "dt_bias", T.SSM_DT, i, one),
            _one(shapes, la + "norm.weight", T.SSM_NORM, i),
            _one(shapes, la + "out_proj.weight", T.SSM_OUT, i, _tile_heads(config, dv, axis=1))]


def _plan_hybrid(config: dict, shapes: dict) -> list[Planned]:
    """qwen3_next and qwen3_5_moe: they differ in the DeltaNet projections and the experts."""
    hidden, family = config["hidden_size"], config["model_type"]
    linear = _linear_qwen3_5 if family == "qwen3_5_moe" else _linear_qwen3_next
    plan = []
    for i in range(config["num_hidden_layers"]):
        pre = f"{_PREFIX.get(family, 'model.')}layers.{i}."
        plan.append(_one(shapes, pre + "input_layernorm.weight", T.ATTN_NORM, i, _plus_one))
        plan.append(_one(shapes, pre + "post_attention_layernorm.weight", T.ATTN_POST_NORM, i,
                         _plus_one))
        if _is_linear(config, i):
            plan += linear(shapes, config, i, pre)
        else:
            for suffix, kind in _ATTN_TENSORS.items():
                fn = _plus_one if kind in (T.ATTN_Q_NORM, T.ATTN_K_NORM) else None
                plan.append(_one(shapes, pre + suffix, kind, i, fn))
        plan.append(_one(shapes, pre + "mlp.gate.weight", T.FFN_GATE_INP, i))
        plan += _experts(shapes, config, i)
        plan += [_one(shapes, f"{pre}mlp.shared_expert.{p}.weight", k, i)
                 for p, k in _SHARED_EXPERT_TENSORS.items()]
        plan.append(_one(shapes, pre + "mlp.shared_expert_gate.weight", T.FFN_GATE_INP_SHEXP, i,
                         lambda w: w.reshape(-1), (hidden,)))
    return plan


def plan_tensors(config: dict, ckpt: SafetensorsCheckpoint,
                 outtype: str = "f32") -> list[Planned]:
    """The GGUF tensors in write order (see :class:`Planned`), for the family named by
    ``config["model_type"]`` (``outtype`` matters to gpt_oss: MXFP4 experts under ``mxfp4``).

    Raises:
        ConversionError: a checkpoint tensor is left unmapped, an expected one is missing, or
            gguf's tensor list for the arch lacks a kind used. (A transform's output shape is
            checked against ``Planned.shape`` when the tensor is written; llama.cpp checks every
            shape against its hyper-parameters when it loads the file.)
    """
    family = config["model_type"]
    shapes = {n: ckpt.shape(n) for n in ckpt.names()}
    plan: list[Planned] = []
    for hf, kind in _GLOBAL_TENSORS.items():
        if kind == T.OUTPUT and config.get("tie_word_embeddings"):
            continue
        hf = hf if kind == T.OUTPUT else _PREFIX.get(family, "model.") + hf
        plan.append(_one(shapes, hf, kind, fn=_plus_one if family in _HYBRID and
                         kind == T.OUTPUT_NORM else None))
    if family == "glm4_moe":
        plan += gguf_glm4_moe.plan(config, shapes)
    elif family == "gpt_oss":
        plan += gguf_gpt_oss.plan(config, shapes, outtype == "mxfp4")
    else:
        plan += (_plan_hybrid if family in _HYBRID else _plan_qwen3_moe)(config, shapes)
    wanted = {n for p in plan for n in p.hf}
    have = set(shapes)
    if missing := sorted(wanted - have):
        raise ConversionError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")
    skipped = (gguf_glm4_moe.skipped_prefixes(config) if family == "glm4_moe"
               else _SKIPPED_PREFIXES.get(family, ()))
    if extra := sorted(n for n in have - wanted if not n.startswith(skipped)):
        raise ConversionError(f"{len(extra)} checkpoint tensors have no GGUF mapping: {extra[:3]}")
    arch = ARCHES[family]
    allowed = {k.name for k in gguf.MODEL_TENSORS[arch]}
    if bad := sorted({p.kind.name for p in plan} - allowed):
        raise ConversionError(f"gguf's {gguf.MODEL_ARCH_NAMES[arch]} tensor list lacks {bad}")
    return plan


def _rope(config: dict) -> tuple[float, float, object]:
    """(rope_theta, partial_rotary_factor, scaling) from top-level keys (transformers v4) or
    ``rope_parameters`` (v5); scaling is None for plain RoPE. partial_rotary_factor defaults to
    transformers' 0.5 for glm4_moe, else to 1.0."""
    params = config.get("rope_parameters") or {}
    theta = params.get("rope_theta", config.get("rope_theta"))
    default = 0.5 if config.get("model_type") == "glm4_moe" else 1.0
    partial = params.get("partial_rotary_factor", config.get("partial_rotary_factor", default))
    scaling = config.get("rope_scaling")
    if params.get("rope_type", "default") != "default":
        scaling = params
    return float(theta), float(partial), scaling


def text_config(config: dict) -> dict:
    """The config the converter reads: ``config.json`` itself, or for qwen3_5_moe (a multimodal
    release) its ``text_config`` with the top-level ``model_type`` and ``tie_word_embeddings``."""
    if config.get("model_type") != "qwen3_5_moe":
        return config
    if not isinstance(text := config.get("text_config"), dict):
        raise ConversionError("qwen3_5_moe config.json has no text_config object")
    return {**text, "model_type": "qwen3_5_moe",
            "tie_word_embeddings": config.get("tie_word_embeddings", False)}


def _check_config(config: dict) -> None:
    family = config.get("model_type")
    if family not in ARCHES:
        raise ConversionError(f"model_type {family!r} is not mapped (only {', '.join(ARCHES)})")
    arch = gguf.MODEL_ARCH_NAMES[ARCHES[family]]
    if family == "gpt_oss":  # sinks, biases, sliding windows, YaRN, MXFP4 experts
        gguf_gpt_oss.check(config)
        return
    if (scaling := _rope(config)[2]) is not None:
        raise ConversionError(f"rope scaling {scaling!r} is not mapped")
    if family == "glm4_moe":  # q/k/v biases, sigmoid group-limited routing, dense layers first
        gguf_glm4_moe.check(config)
        return
    if config.get("attention_bias"):
        raise ConversionError("attention_bias=true is not mapped")
    if family in _HYBRID:
        _check_hybrid(config)
    if family == "qwen3_5_moe":  # every layer MoE, top-k always renormalised
        if not config.get("attn_output_gate", True):
            raise ConversionError(f"attn_output_gate=false: llama.cpp's {arch} always gates")
        return
    if not config.get("norm_topk_prob", False):
        raise ConversionError(f"norm_topk_prob=false: llama.cpp's {arch} always renormalises top-k")
    if config.get("mlp_only_layers") or config.get("decoder_sparse_step", 1) != 1:
        raise ConversionError(f"dense (mlp_only) layers are not supported by llama.cpp's {arch}")


def _check_hybrid(config: dict) -> None:
    arch = gguf.MODEL_ARCH_NAMES[ARCHES[config["model_type"]]]
    if config.get("hidden_act", "silu") != "silu":
        raise ConversionError(f"hidden_act {config['hidden_act']!r}: llama.cpp's {arch} is silu")
    nk, nv = config["linear_num_key_heads"], config["linear_num_value_heads"]
    if config["linear_key_head_dim"] != config["linear_value_head_dim"]:
        raise ConversionError(f"linear_key_head_dim != linear_value_head_dim: llama.cpp's {arch} "
                              "reads both from ssm.state_size")
    if nv % nk:
        raise ConversionError(f"linear_num_value_heads {nv} is not a multiple of "
                              f"linear_num_key_heads {nk}")
    layers = config["num_hidden_layers"]
    pattern = ["linear_attention" if _is_linear(config, i) else "full_attention"
               for i in range(layers)]
    if (types := config.get("layer_types")) is not None and list(types) != pattern:
        raise ConversionError("layer_types is not the full_attention_interval pattern (gguf 0.19.0 "
                              "has no per-layer recurrent key)")


def _write_metadata(w: gguf.GGUFWriter, config: dict, model_dir: Path, ftype) -> None:
    w.add_name(model_dir.name)
    w.add_block_count(config["num_hidden_layers"])
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    if "intermediate_size" in config:  # qwen3_5_moe has no dense FFN width
        w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    head_dim = config.get("head_dim", config["hidden_size"] // config["num_attention_heads"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    theta, partial, _ = _rope(config)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    if config["model_type"] == "glm4_moe":
        gguf_glm4_moe.add_hparams(w, config, head_dim, partial)
    elif config["model_type"] == "gpt_oss":
        gguf_gpt_oss.add_hparams(w, config)
    else:
        w.add_expert_count(config["num_experts"])
        w.add_expert_used_count(config["num_experts_per_tok"])
        w.add_expert_feed_forward_length(config["moe_intermediate_size"])
    if config["model_type"] in _HYBRID:
        w.add_rope_dimension_count(int(head_dim * partial))
        w.add_expert_shared_feed_forward_length(config["shared_expert_intermediate_size"])
        w.add_full_attention_interval(config.get("full_attention_interval", 4))
        w.add_ssm_conv_kernel(config["linear_conv_kernel_dim"])
        w.add_ssm_state_size(config["linear_key_head_dim"])
        w.add_ssm_group_count(config["linear_num_key_heads"])
        w.add_ssm_time_step_rank(config["linear_num_value_heads"])
        w.add_ssm_inner_size(config["linear_num_value_heads"] * config["linear_value_head_dim"])
    if config["model_type"] == "qwen3_5_moe":  # M-RoPE equal to 1-D RoPE on text (docstring)
        pairs = int(head_dim * partial) // 2
        w.add_rope_dimension_sections([-(-(pairs - k) // 3) for k in range(3)] + [0])
    w.add_file_type(ftype)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    vocab = load_vocab(model_dir, config["vocab_size"], config.get("bos_token_id"))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(vocab.pre)
    w.add_token_list(vocab.tokens)
    w.add_token_types(vocab.token_types)
    w.add_token_merges(vocab.merges)
    w.add_bos_token_id(vocab.bos_id)
    w.add_eos_token_id(vocab.eos_id)
    if config["model_type"] == "glm4_moe":
        gguf_glm4_moe.add_turn_ends(w, vocab.tokens)
    if vocab.pad_id is not None:
        w.add_pad_token_id(vocab.pad_id)
    w.add_add_bos_token(False)
    if vocab.chat_template:
        w.add_chat_template(vocab.chat_template)


def default_outtype(config: dict, ckpt: SafetensorsCheckpoint) -> str:
    """``mxfp4`` for a gpt_oss checkpoint with MXFP4 experts (the releases' own bytes), else
    ``f32`` (exact)."""
    shapes = {n: ckpt.shape(n) for n in ckpt.names()}
    return ("mxfp4" if config.get("model_type") == "gpt_oss"
            and gguf_gpt_oss.experts_mxfp4(shapes) else "f32")


def convert(model_dir: str | Path, out_path: str | Path, outtype: str | None = None,
            log=print) -> Path:
    """Write ``out_path`` (GGUF, arch ``qwen3moe``, ``qwen3next``, ``qwen35moe``, ``glm4moe`` or
    ``gpt-oss``) from the checkpoint in ``model_dir``.

    Args:
        model_dir: HF checkpoint directory (config.json, safetensors, tokenizer.json).
        out_path: destination file; written to ``<out>.tmp`` then renamed.
        outtype: ``f32`` (exact), ``bf16`` (exact for bf16 weights), ``f16``, ``mxfp4`` (MXFP4
            experts kept, the rest as stored) or None for :func:`default_outtype`.
        log: progress callback (one line per call); also gets the family's notes on what
            llama.cpp computes differently (``gguf_gpt_oss.notes``).

    Returns:
        the written path.

    Raises:
        ConversionError: unsupported architecture/config, or tensors that do not map 1:1.
        FileNotFoundError: missing config.json / weights / tokenizer.json.
    """
    model_dir, out_path = Path(model_dir), Path(out_path)
    if outtype is not None and outtype not in OUTTYPES:
        raise ConversionError(f"outtype {outtype!r}; expected one of {', '.join(OUTTYPES)}")
    config = text_config(json.loads((model_dir / "config.json").read_text(encoding="utf-8")))
    _check_config(config)
    ckpt = SafetensorsCheckpoint(model_dir)
    outtype = outtype or default_outtype(config, ckpt)
    if outtype == "mxfp4" and config["model_type"] != "gpt_oss":
        raise ConversionError("outtype mxfp4 is for gpt_oss checkpoints with MXFP4 experts")
    plan = plan_tensors(config, ckpt, outtype)
    if config["model_type"] == "gpt_oss":
        head_dim = config.get("head_dim", config["hidden_size"] // config["num_attention_heads"])
        for line in gguf_gpt_oss.notes(config, head_dim, _rope(config)[0]):
            log(line)
    t0 = time.perf_counter()
    tmp = out_path.with_name(out_path.name + ".tmp")
    w = gguf.GGUFWriter(tmp, gguf.MODEL_ARCH_NAMES[ARCHES[config["model_type"]]])
    _write_metadata(w, config, model_dir, OUTTYPES[outtype][1])

    types = {p.name: tensor_type(p, ckpt, outtype) for p in plan}
    for p in plan:
        add_tensor_info(w, p, types[p.name])
    w.write_header_to_file(tmp)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for p in _iter_logged(plan, log):
        data = encode(ckpt, p, types[p.name])
        if data.shape != (want := stored_shape(p, types[p.name])):
            raise ConversionError(f"{p.name}: transform gave {data.shape}, planned {want}")
        w.write_tensor_data(data)
    w.close()
    tmp.replace(out_path)
    log(f"wrote {out_path} ({out_path.stat().st_size / 2**20:.1f} MiB, {len(plan)} tensors, "
        f"{outtype}) in {time.perf_counter() - t0:.1f} s")
    return out_path


def _iter_logged(plan: list, log) -> Iterator:
    step = max(1, len(plan) // 10)
    for n, item in enumerate(plan):
        if n % step == 0:
            log(f"  tensor {n + 1}/{len(plan)}: {item[0]}")
        yield item


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; exit 0 on success, 2 on a conversion error (message on stderr)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir")
    p.add_argument("out")
    p.add_argument("--outtype", choices=sorted(OUTTYPES), default=None,
                   help="default: mxfp4 for MXFP4 experts (gpt_oss releases), else f32")
    args = p.parse_args(argv)
    try:
        convert(args.model_dir, args.out, args.outtype, log=lambda s: print(s, file=sys.stderr))
    except (ConversionError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
